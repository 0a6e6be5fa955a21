"""Preprocess as an Apache Beam pipeline: the same per-image logic (per_image.py) on Beam's workers, for sources
that outgrow one machine (on Dataflow: components/preprocess/dataflow.py), as TFX's ExampleGen does.

The graph (`build_graph`):

    inputs.jsonl (one line per input, numbered in the source's order)
      -> Reshuffle -> Decode (per_image.decode_file: read, decode, conform, content key, encode; or a reject)
      -> GroupByKey(content key) -> Dedup: the lowest-numbered input of a key is kept (the one the in-process
         runner meets first); the others are duplicates or duplicates with another label, rejected with
         per_image.duplicate_rejection (this is also where a training copy of a source test image is caught:
         test inputs are numbered first)
      -> GroupByKey(label) of the kept content keys -> each class's cuts (per_image.split_cuts), a side input
         -> each kept input's split (per_image.assign_split), and the split named in its duplicates' rejections
         (near-copies, kept inputs with one near key, are split by their group's key: GroupByKey(near key) ->
         per_image.near_group_key, a side input of the cuts and of the split assignment)
      -> per split: WriteToTFRecord(SPLIT/SPLIT-SSSSS-of-NNNNN.tfrecord), the shard count fixed up front
      -> small side outputs under a work folder: counts per split and class, bytes, encodings, the pixel
         histogram of the train split, the first training images per class (samples), the rejects.

`run_beam` writes the inputs file, runs the graph, and turns the side outputs into what the in-process runner
produces (rejected.jsonl in input order, the manifest, samples.png) through step.finish, so the dataset
directory is the same whichever runner wrote it (tests/test_preprocess_beam.py checks).

Beam runs in tests on its in-process FnApiRunner: nothing to download, no network (Beam's DirectRunner may
hand a pipeline to Prism, a separate binary that it downloads, so the runner is named explicitly).
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid

import numpy as np

from components.dataio import data
from components.preprocess import per_image
from components.preprocess.bookkeeping import (CARD_MAX_CLASSES, SAMPLES_PER_CLASS, SourceStats, Tally,
                                               image_histogram)
from components.preprocess.inputs import Source

log = logging.getLogger(__name__)

WORK_DIR = "_beam"  # under the output directory while the pipeline runs; removed after


class BeamSettings:
    """What every worker needs: picklable and small."""

    def __init__(self, *, image_size: int, channels: int, check_extension: bool, validation_fraction: float,
                 test_fraction: float, class_names: list[str], sample_classes: int, samples_per_class: int):
        self.image_size, self.channels, self.check_extension = image_size, channels, check_extension
        self.validation_fraction, self.test_fraction = validation_fraction, test_fraction
        self.class_names, self.sample_classes, self.samples_per_class = class_names, sample_classes, samples_per_class


def _decode(line: str, settings: BeamSettings):
    """One numbered input -> ("kept", (key, element)) or ("rejected", row)."""
    import apache_beam as beam

    ordinal, uri, label, split, problem = json.loads(line)
    if problem:
        yield beam.pvalue.TaggedOutput("rejected", (ordinal, label, per_image.rejected_row(uri, *problem)))
        return
    size = settings.image_size
    ex = per_image.decode_file(uri, label, split, size, size, settings.channels, settings.check_extension)
    if not ex.kept:
        yield beam.pvalue.TaggedOutput("rejected", (ordinal, label, per_image.rejected_row(uri, ex.reason,
                                                                                            ex.detail)))
        return
    stored = ex.image.tobytes() if ex.stored is None else ex.stored
    source = (ex.source_size, ex.source_bytes, ex.reencoded) if ex.source_size else None
    histogram = image_histogram(ex.image, settings.channels) if ex.histogram is None else ex.histogram
    near = ex.near_key if ex.near_key is not None else data.near_key(ex.image)
    yield ex.key, (ordinal, uri, label, split, stored, ex.encoding, histogram, source, near)


def _dedup(keyed):
    """All inputs with one content key -> the kept one ("kept": (key, element)) and the duplicates
    ("duplicates": (ordinal, uri, label, kept key, kept label, kept source split))."""
    import apache_beam as beam

    key, elements = keyed
    ordered = sorted(elements, key=lambda e: e[0])
    kept = ordered[0]
    yield key, kept
    for other_ordinal, other_uri, other_label, *_ in ordered[1:]:
        yield beam.pvalue.TaggedOutput("duplicates", (other_ordinal, other_uri, other_label, key, kept[2], kept[3]))


def _class_cuts(keyed, settings: BeamSettings):
    """(label, [(content key, source split)]) -> (label, that class's cuts)."""
    label, keys = keyed
    cuts = per_image.split_cuts(((label, key, source_split) for key, source_split in keys),
                                settings.validation_fraction, settings.test_fraction)
    return label, cuts.get(label, per_image.NO_CUTS)


def _group_keys(keyed):
    """A near key's kept content keys -> (content key, the group's split key) for each member of a group of two
    or more whose split key is not its own (per_image.near_group_key)."""
    _, keys = keyed
    keys = list(keys)
    if len(keys) < 2:
        return
    group_key = per_image.near_group_key(keys)
    for key in keys:
        if key != group_key:
            yield key, group_key


def _near_summary(keyed):
    """A near key's kept inputs' splits -> the group's counts (per_image.near_group_summary), for two or more."""
    _, splits = keyed
    splits = sorted(splits)
    if len(splits) > 1:
        yield per_image.near_group_summary(splits)


def _assign(kept, cuts: dict, group_keys: dict):
    """A kept input, its split fixed -> (split, ordinal, label, record, stored, encoding, histogram, source file's
    (size, bytes, why re-encoded) or None, near key)."""
    key, (ordinal, uri, label, source_split, stored, encoding, histogram, source, near) = kept
    split = per_image.assign_split(group_keys.get(key, key), source_split, cuts.get(label, per_image.NO_CUTS))
    return split, ordinal, label, data.encode_example(stored, label, uri), stored, encoding, histogram, source, near


def _duplicate_row(duplicate, cuts: dict, group_keys: dict, settings: BeamSettings):
    ordinal, uri, label, kept_key, kept_label, kept_source_split = duplicate
    kept_split = per_image.assign_split(group_keys.get(kept_key, kept_key), kept_source_split,
                                        cuts.get(kept_label, per_image.NO_CUTS))
    reason, detail = per_image.duplicate_rejection(label, kept_label, kept_split, settings.class_names)
    return ordinal, label, per_image.rejected_row(uri, reason, detail)


def _write_json_lines(pcoll, path: str, label: str):
    import apache_beam as beam

    return (pcoll | f"{label}: to JSON" >> beam.Map(json.dumps)
            | f"{label}: write" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1))


def build_graph(pipeline, *, inputs_path: str, output_dir: str, work_dir: str, shards: dict[str, int],
                settings: BeamSettings) -> None:
    """Adds preprocessing to a Beam pipeline (see the module docstring); outputs land under output_dir."""
    import apache_beam as beam

    decoded = (pipeline
               | "Read inputs" >> beam.io.ReadFromText(inputs_path, validate=False)  # no listing while building
               | "Spread inputs" >> beam.Reshuffle()
               | "Decode" >> beam.FlatMap(_decode, settings).with_outputs("rejected", main="kept"))
    deduped = (decoded.kept
               | "Group by content" >> beam.GroupByKey()
               | "Keep first of each content" >> beam.FlatMap(_dedup).with_outputs("duplicates", main="kept"))
    # Near-copies are split by their group's key (per_image.near_group_key): a side input of the members whose
    # split key is not their own (a dict on each worker, two ints per such image)
    group_keys = beam.pvalue.AsDict(deduped.kept
                                    | "Near: keys" >> beam.Map(lambda kept: (kept[1][8], kept[0]))
                                    | "Near: group" >> beam.GroupByKey()
                                    | "Near: group keys" >> beam.FlatMap(_group_keys))
    cuts = beam.pvalue.AsDict(deduped.kept
                              | "Cuts: keys by class" >> beam.Map(
                                  lambda kept, groups: (kept[1][2], (groups.get(kept[0], kept[0]), kept[1][3])),
                                  group_keys)
                              | "Cuts: group" >> beam.GroupByKey()
                              | "Cuts: per class" >> beam.Map(_class_cuts, settings))
    kept = deduped.kept | "Assign splits" >> beam.Map(_assign, cuts, group_keys)
    duplicates = (deduped.duplicates
                  | "Duplicates: rejections" >> beam.Map(_duplicate_row, cuts, group_keys, settings))
    near_counts = (kept | "Near: splits" >> beam.Map(lambda k: (k[8], k[0]))
                   | "Near: by group" >> beam.GroupByKey()
                   | "Near: group counts" >> beam.FlatMap(_near_summary)
                   | "Near: sum" >> beam.CombineGlobally(
                       lambda rows: [sum(column) for column in zip(*rows)] or [0] * len(per_image.NEAR_GROUP_FIELDS))
                   | "Near: row" >> beam.Map(lambda row: dict(zip(per_image.NEAR_GROUP_FIELDS, row))))
    _write_json_lines(near_counts, data.join(work_dir, "near.jsonl"), "Near")
    for split in data.SPLITS:
        (kept | f"{split}: select" >> beam.Filter(lambda k, s=split: k[0] == s)
         | f"{split}: records" >> beam.Map(lambda k: k[3])
         | f"{split}: write shards" >> beam.io.WriteToTFRecord(
             data.join(output_dir, split, split), file_name_suffix=".tfrecord", num_shards=shards[split],
             shard_name_template="-SSSSS-of-NNNNN"))
    counts = (kept | "Count: key" >> beam.Map(lambda k: (f"{k[0]}/{k[2]}", (1, len(k[3]))))
              | "Count: sum" >> beam.CombinePerKey(lambda values: tuple(map(sum, zip(*values))))
              | "Count: row" >> beam.Map(lambda kv: {"split_label": kv[0], "count": kv[1][0], "bytes": kv[1][1]}))
    _write_json_lines(counts, data.join(work_dir, "counts.jsonl"), "Counts")
    encodings = (kept | "Encodings: pair" >> beam.Map(lambda k: (k[0], k[5])) | "Encodings: distinct" >> beam.Distinct()
                 | "Encodings: row" >> beam.Map(lambda kv: {"split": kv[0], "encoding": kv[1]}))
    _write_json_lines(encodings, data.join(work_dir, "encodings.jsonl"), "Encodings")
    histogram = (kept | "Pixels: train" >> beam.Filter(lambda k: k[0] == "train")
                 | "Pixels: histogram" >> beam.Map(lambda k: k[6])
                 | "Pixels: sum" >> beam.CombineGlobally(lambda hs: np.sum(list(hs), axis=0) if hs else [])
                 | "Pixels: row" >> beam.Map(lambda h: {"histogram": [int(v) for v in h]}))
    _write_json_lines(histogram, data.join(work_dir, "pixels.jsonl"), "Pixels")
    sources = (kept | "Sources: one" >> beam.Filter(lambda k: k[7] is not None)
               | "Sources: row" >> beam.Map(lambda k: SourceStats.row_of(*k[7]))
               | "Sources: sum" >> beam.CombineGlobally(SourceStats.combine)
               | "Sources: json" >> beam.Map(lambda row: {"row": row}))
    _write_json_lines(sources, data.join(work_dir, "sources.jsonl"), "Sources")
    samples = (kept | "Samples: train" >> beam.Filter(lambda k: k[0] == "train" and k[2] < settings.sample_classes)
               | "Samples: by class" >> beam.Map(lambda k: (k[2], (k[1], base64.b64encode(k[4]).decode(), k[5])))
               | "Samples: first" >> beam.combiners.Top.SmallestPerKey(settings.samples_per_class,
                                                                       key=lambda v: v[0])
               | "Samples: row" >> beam.Map(lambda kv: {"label": kv[0], "samples": kv[1]}))
    _write_json_lines(samples, data.join(work_dir, "samples.jsonl"), "Samples")
    rejected = ((decoded.rejected, duplicates) | "Rejects: merge" >> beam.Flatten()
                | "Rejects: row" >> beam.Map(lambda r: {"ordinal": r[0], "label": r[1], **r[2]}))
    _write_json_lines(rejected, data.join(work_dir, "rejected.jsonl"), "Rejects")


def local_pipeline_options():
    """Options for the in-process runner (tests, and `preprocess --runner beam` on one machine)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions([])


def write_inputs(src: Source, path: str) -> int:
    """The source's inputs, numbered in its order, one JSON list per line; returns how many."""
    count = 0
    with data.gfile().GFile(path, "w") as f:
        for ordinal, item in enumerate(src.items()):
            f.write(json.dumps([ordinal, item.uri, item.label, item.split, item.problem]) + "\n")
            count = ordinal + 1
    return count


def run_beam(src: Source, output_dir: str, *, shards: dict[str, int], image_size: int, channels: int,
             validation_fraction: float, test_fraction: float, options=None, dataflow=None, dataflow_jobs=None):
    """Runs the Beam pipeline for a file source and gathers what step.finish needs (see step._run_local).

    Runs on Beam's in-process FnApiRunner, or with `options` (PipelineOptions) on the runner they name, or with
    `dataflow` (a DataflowSettings) as a Dataflow job followed to its end (`dataflow_jobs`: a DataflowJobs client,
    by default one for the settings' project, region and endpoint)."""
    import apache_beam as beam

    if src.items is None:
        raise data.DataError(f"The Beam runner reads image files (a class-folder tree or a CSV/JSONL manifest); "
                             f"a {src.kind} source is preprocessed in process: use preprocess_runner=local")
    work_dir = data.join(output_dir, f"{WORK_DIR}-{uuid.uuid4().hex[:8]}")
    data.gfile().makedirs(work_dir)
    inputs_path = data.join(work_dir, "inputs.jsonl")
    seen = write_inputs(src, inputs_path)
    settings = BeamSettings(image_size=image_size, channels=channels, check_extension=src.kind == "folder",
                            validation_fraction=validation_fraction, test_fraction=test_fraction,
                            class_names=src.class_names, sample_classes=min(len(src.class_names), CARD_MAX_CLASSES),
                            samples_per_class=SAMPLES_PER_CLASS)
    started = time.monotonic()
    try:
        if dataflow is not None:
            from components.preprocess import dataflow as dataflow_lib

            pipeline = beam.Pipeline(options=dataflow.pipeline_options(dataflow_lib.job_name_for(output_dir)))
            build_graph(pipeline, inputs_path=inputs_path, output_dir=output_dir, work_dir=work_dir, shards=shards,
                        settings=settings)
            jobs = dataflow_jobs or dataflow_lib.DataflowJobs(dataflow.project, dataflow.region,
                                                              api_endpoint=dataflow.api_endpoint)
            dataflow_lib.launch(pipeline, dataflow, jobs)
        else:
            runner = None
            if options is None:
                from apache_beam.runners.portability.fn_api_runner import FnApiRunner

                runner = FnApiRunner()
            pipeline = beam.Pipeline(runner=runner, options=options or local_pipeline_options())
            build_graph(pipeline, inputs_path=inputs_path, output_dir=output_dir, work_dir=work_dir, shards=shards,
                        settings=settings)
            pipeline.run().wait_until_finish()
    except BaseException:
        data.gfile().rmtree(work_dir)
        raise
    try:
        splits, tally = gather(output_dir, work_dir, shards, src.class_names, channels, settings)
    finally:
        data.gfile().rmtree(work_dir)
    return splits, tally, seen, started


def _read_lines(path: str) -> list[dict]:
    return list(data.iter_jsonl(path))


def gather(output_dir: str, work_dir: str, shards: dict[str, int], class_names: list[str], channels: int,
           settings: BeamSettings):
    """The pipeline's side outputs -> (split summaries, Tally); writes rejected.jsonl in input order and drops the
    empty shards of splits that got fewer records than shards (as ShardWriter.close does)."""
    tally = Tally(len(class_names), channels)
    rows = sorted(_read_lines(data.join(work_dir, "rejected.jsonl")), key=lambda r: r["ordinal"])
    with data.gfile().GFile(data.join(output_dir, data.REJECTED), "w") as f:
        f.write("")
        for row in rows:
            tally.reject(row["label"], row["reason"])
            f.write(json.dumps(per_image.rejected_row(row["uri"], row["reason"], row["detail"])) + "\n")
    pixels = _read_lines(data.join(work_dir, "pixels.jsonl"))
    if pixels and pixels[0]["histogram"]:
        tally.pixel_stats.histogram += np.asarray(pixels[0]["histogram"], np.int64)
    for row in _read_lines(data.join(work_dir, "sources.jsonl")):
        tally.source_files = SourceStats.from_row(row["row"])
    for row in _read_lines(data.join(work_dir, "near.jsonl")):
        tally.near_duplicates.update(row)
    shape = [settings.image_size, settings.image_size, channels]
    for row in _read_lines(data.join(work_dir, "samples.jsonl")):
        tally.samples[row["label"]] = [per_image.stored_pixels(base64.b64decode(stored), encoding, shape)
                                       for _, stored, encoding in row["samples"]]
    counts = {s: {"count": 0, "bytes": 0, "class_counts": {}} for s in data.SPLITS}
    for row in _read_lines(data.join(work_dir, "counts.jsonl")):
        split, label = row["split_label"].split("/")
        counts[split]["count"] += row["count"]
        counts[split]["bytes"] += row["bytes"]
        counts[split]["class_counts"][label] = row["count"]
    encodings: dict[str, set] = {s: set() for s in data.SPLITS}
    for row in _read_lines(data.join(work_dir, "encodings.jsonl")):
        encodings[row["split"]].add(row["encoding"])
    encoding = data.dataset_encoding(set().union(*encodings.values()))
    splits = {}
    for split in data.SPLITS:
        num_shards = _drop_empty_shards(output_dir, split, shards[split], counts[split]["count"])
        splits[split] = {"path": split, "pattern": f"{split}-*.tfrecord", "num_shards": num_shards,
                         "count": counts[split]["count"], "bytes": counts[split]["bytes"],
                         "class_counts": dict(sorted(counts[split]["class_counts"].items(), key=lambda kv: int(kv[0]))),
                         "encoding": encoding}
    return splits, tally


def _drop_empty_shards(output_dir: str, split: str, planned: int, count: int) -> int:
    """Beam writes every planned shard, empty or not; readers should never see an empty one."""
    directory = data.join(output_dir, split)
    files = data.glob(data.join(directory, f"{split}-*-of-{planned:05d}.tfrecord"))
    keep = [f for f in files if data.gfile().stat(f).length > 0] or files[:1]  # an empty split keeps one
    if len(keep) == len(files):
        return len(files)
    for f in files:
        if f not in keep:
            data.gfile().remove(f)
    for index, old in enumerate(keep):
        data.gfile().rename(old, data.join(directory, f"{split}-{index:05d}-of-{len(keep):05d}.tfrecord"),
                            overwrite=True)
    return len(keep)
