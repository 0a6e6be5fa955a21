"""The command line of batch prediction (`python -m components.predict`), and the options it shares with
`pipectl predict`: here, or as a Vertex AI batch prediction job."""

from __future__ import annotations

import argparse
import re

from components import gcp, stepcli
from components.predict.local import predict
from components.predict.output import PredictResult
from components.predict.vertex import vertex_batch_predict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The prediction options shared by this module's CLI and `pipectl predict`."""
    parser.add_argument("--batch-size", type=int,
                        help="images per model call (default: from the image size, 512 for 28x28, 128 for 224x224x3)")
    parser.add_argument("--top-k", type=int, default=3, help="classes kept per image (default: %(default)s)")
    parser.add_argument("--chunk-size", type=int, default=10_000,
                        help="inputs per output shard, the unit of restart (default: %(default)s)")
    parser.add_argument("--print-first", type=int, default=1000,
                        help="print this many predictions in full, then progress lines (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the predictions the output folder holds from another model or other options "
                        "(without it, such a folder is refused; a rerun with the same model and options resumes)")
    parser.add_argument("--cpu-decode", action="store_true",
                        help="decode JPEGs on the CPU even where torchvision could decode them on the GPU (nvJPEG): "
                        "the readers' exact pixels, rather than within a few levels")
    vertex = parser.add_argument_group("on Vertex AI (a BatchPredictionJob instead of this machine)")
    vertex.add_argument("--vertex-model", metavar="RESOURCE",
                        help="the registered model: projects/P/locations/L/models/ID[@VERSION_OR_ALIAS]")
    vertex.add_argument("--staging", metavar="GS_URI", help="gs:// folder for the instances file and the job's output")
    vertex.add_argument("--machine-type", default="n1-standard-4", help="default: %(default)s")
    vertex.add_argument("--accelerator-type", default="", help="e.g. NVIDIA_TESLA_T4 (default: none)")
    vertex.add_argument("--accelerator-count", type=int, default=0)
    vertex.add_argument("--max-replicas", type=int, default=1, help="workers the job may scale to (default: 1)")

def predict_from_args(args: argparse.Namespace, model_dir: str, images: str, output_dir: str) -> PredictResult:
    """Runs what the options of `add_arguments` ask for: here, or as a Vertex AI batch prediction job."""
    if not args.vertex_model:
        return predict(model_dir, images, output_dir, batch_size=args.batch_size, top_k=args.top_k,
                       chunk_size=args.chunk_size, print_first=args.print_first,
                       gpu_decode=not args.cpu_decode, overwrite=args.overwrite)
    if not args.staging:
        raise ValueError("--vertex-model needs --staging gs://BUCKET/FOLDER for the instances and the job's output")
    location = re.match(r"^projects/[^/]+/locations/([^/]+)/", args.vertex_model)
    if not location:
        raise ValueError(f"Not a Vertex AI model resource name: {args.vertex_model!r}")
    return vertex_batch_predict(model_dir, args.vertex_model, images, output_dir,
                                client=gcp.job_client(location.group(1)), staging_uri=args.staging,
                                top_k=args.top_k, machine_type=args.machine_type,
                                accelerator_type=args.accelerator_type, accelerator_count=args.accelerator_count,
                                max_replicas=args.max_replicas, overwrite=args.overwrite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.predict",
        description="Classify every image of a folder, glob, manifest or TFRecord shards with a trained model.")
    parser.add_argument("--model-dir", required=True, help="output of train (or an exported SavedModel)")
    parser.add_argument("--images", required=True,
                        help="folder (recursive), glob, manifest (.txt/.csv/.jsonl) or TFRecord shards; local or gs://")
    parser.add_argument("--output-dir", required=True)
    add_arguments(parser)
    args = parser.parse_args(argv)
    # The Vertex AI path's errors (the Google Cloud layer's) state their own exit codes, which stepcli honours.
    return stepcli.run(lambda: predict_from_args(args, args.model_dir, args.images, args.output_dir))

