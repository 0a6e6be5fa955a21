"""The command line of the preprocess step (`python -m components.preprocess`)."""

from __future__ import annotations

import argparse

from components import params, stepcli
from components.dataio import data
from components.preprocess.card import dataset_card
from components.preprocess.step import preprocess


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.preprocess",
                                     description="Preprocess a labelled image source into TFRecord shards.")
    parser.add_argument("--source", default=data.DEFAULT_SOURCE,
                        help="idx directory, class-per-folder image tree (local or gs://), a .csv/.jsonl manifest "
                             "of (uri, label) rows, or tfds:NAME[:SPLIT]")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1, help="used when the source has no test split")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1, choices=(1, 3))
    parser.add_argument("--limit", type=int, help=params.PARAMETERS["limit"].help)
    parser.add_argument("--min-shards", type=int, default=2, help="training workers that will read each split")
    parser.add_argument("--classes", help="comma-separated allowed classes, in label order (default: any)")
    parser.add_argument("--workers", type=int, help="CPUs to decode with (default: the CPUs this process may use)")
    parser.add_argument("--runner", choices=("local", "beam"), default="local",
                        help="local: decode in this process and its workers; beam: the same as an Apache Beam "
                             "pipeline on Beam's in-process runner (the pipeline's preprocess_runner=dataflow runs it "
                             "on Dataflow)")
    parser.add_argument("--card", help="also write the HTML dataset card to this file")
    args = parser.parse_args(argv)

    def step():
        result = preprocess(args.source, args.output_dir, validation_fraction=args.validation_fraction,
                            test_fraction=args.test_fraction, image_size=args.image_size, channels=args.channels,
                            limit=args.limit or None, min_shards=args.min_shards, classes=args.classes, workers=args.workers,
                            runner=args.runner)
        if args.card:
            with data.gfile().GFile(args.card, "w") as f:
                f.write(dataset_card(args.output_dir))
        return result

    return stepcli.run(step)
