"""Preprocess: read a source of labelled images and write sharded TFRecords for train / validation / test.

Sources:
  - a directory of MNIST-format idx files (`*-images-idx3-ubyte[.gz]` + `*-labels-idx1-ubyte[.gz]`);
    `train-*` feeds train and validation, `t10k-*`/`test-*` is the test split;
  - a folder with one subfolder per class holding image files (local or `gs://`);
  - a manifest of `(uri, label)` rows, `.csv` or `.jsonl` (local or `gs://`), as labelling tools export them:
    a CSV with a header naming the columns (`uri`/`path`/`image`..., `label`/`class`...), a headerless
    `uri,label` CSV, Vertex AI's `ML_USE,GCS_FILE_PATH,LABEL` CSV, or JSONL with `uri`/`label` keys or
    Vertex AI's `imageGcsUri` + `classificationAnnotation.displayName`. Relative paths are read beside the
    manifest; rows marked `test` (ML_USE) stay the test split;
  - `tfds:NAME[:SPLIT]` through tensorflow-datasets.

Every image is decoded, converted to grayscale or RGB and resized (see `data.decode_image`), and stored as
raw uint8 with its label and source uri. Decoding runs in parallel (processes for local files, threads for
remote ones, whose cost is waiting on the network) with a bounded number of images in flight; listings are
streamed, so memory does not grow with the number of images (except 12 bytes per image for duplicate
detection and 8 for near-duplicates).

Splits are deterministic: an image's split is fixed by a hash of its bytes (the file's bytes, or the raw
pixels of idx/tfds sources), so the same input gives the same split on any machine, in any order and at any
target size, and identical images never straddle two splits. Where the source has its own test split, it
stays the test split and training copies of test images are dropped (leakage). Duplicates are kept once.
Near-copies (equal perceptual keys, `images.near_keys`) are split as one group, by the group's lowest content
key (`per_image.near_group_key`); the manifest's `near_duplicates`, the card and the console say how many, and
warn where a group still straddles test and training (the source's own test split).

Unusable inputs (unreadable, empty, not an image, corrupt or truncated, unsupported format or mode, too
large, duplicates) are listed in `rejected.jsonl` with their reason and counted per reason; nothing is
dropped silently and none of them stops the run. The run fails, with a message saying what to fix, when
nothing usable is left, a class ends up with no images, there are fewer than 2 classes, a class is not in an
explicit `classes` list, or a manifest label is not a known class.

Two runners share the per-image logic (`per_image`): in process (`step`, the default) or as an Apache Beam
pipeline (`beam`; on Dataflow with preprocess_runner=dataflow: `dataflow`); they give the same dataset.

Where things are: `sources` (the readers and `open_source`), `decoding` (parallel decoding, CPU planning),
`classes` (the allow-list), `inputs` (`Example`, `Source`, rejection reasons, content keys), `bookkeeping`
(duplicates index, progress, pixel statistics), `step` (`preprocess`), `card` (`dataset_card`), `cli`.
"""

from components.preprocess.card import dataset_card
from components.preprocess.cli import main
from components.preprocess.dataflow import DataflowSettings
from components.preprocess.inputs import BAD_ROW, CONFLICTING_LABEL, DUPLICATE, OUTSIDE_CLASSES
from components.preprocess.step import SAMPLES_FILE, SAMPLES_PHOTO_FILE, PreprocessResult, preprocess

__all__ = ["BAD_ROW", "CONFLICTING_LABEL", "DUPLICATE", "OUTSIDE_CLASSES", "SAMPLES_FILE", "SAMPLES_PHOTO_FILE",
           "DataflowSettings", "PreprocessResult", "dataset_card", "main", "preprocess"]
