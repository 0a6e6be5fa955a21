"""Batch predict: classify millions of images with a trained model, streaming, restartable.

Sources (`--images`), local or `gs://`:

- a folder, searched recursively (`gs://bucket/images`);
- a glob (`gs://bucket/images/**/*.jpg`: `*` stays within a folder, `**` crosses folders);
- a manifest: a `.txt` file with one uri per line, a `.csv` with a `uri` column (or uris in the first
  column), or a `.jsonl` with `uri` (or Vertex AI's `content`) per line; relative entries are taken from
  the manifest's folder;
- TFRecord shards (`gs://bucket/shards/*.tfrecord`, `.tfrecord.gz` for GZIP): `tf.train.Example`s with the
  encoded image in `image/encoded` or `image` (or raw uint8 pixels of the model's input size, as this
  project's own dataset shards hold) and its name in `uri`, `image/filename` or `filename`.

How it goes: inputs are listed lazily in a stable order (folders sorted level by level) and cut into chunks of
`chunk_size` inputs (for shards: one chunk per shard). Within a chunk, a background thread reads a batch of
files in parallel and decodes it while the model (GPU when present) predicts the previous one. Images already
at the model's size and colour mode are decoded by TensorFlow's C++ decoders across the whole batch in parallel,
to the same pixels training's decoder gives (8-bit PNG; JPEG with the exact DCT). Anything else (other sizes or
modes, 16-bit, palettes, transparency) is converted by `data.decode_image`, the decoder preprocessing uses, in
a thread pool. Memory stays bounded: neither the listing nor a chunk's results are held; rows are written as
they are predicted.

Outputs in `output_dir`:

    shards/predictions-NNNNN.jsonl   one row per image: uri, class_index, class_name, confidence, top_k
    shards/predictions-NNNNN.csv     the same as columns (top2_..., top3_... for the runners-up)
    shards/errors-NNNNN.jsonl        inputs that could not be read or decoded: uri and reason
    shards/chunk-NNNNN.json          written last: the chunk is complete (its fingerprint, model, options, counts)
    predictions.jsonl, predictions.csv   all shards in one file, when there are at most `combine_max` rows
    errors.jsonl                     all errors
    summary.json                     counts, throughput, the files above

A rerun over the same inputs and output skips every chunk whose marker matches its inputs, so an interrupted
job does not start over (a chunk whose inputs changed is redone). A marker's fingerprint also covers the model's
digest (components/registry/identity.py) and every option that changes a row (top_k, the image size, the JPEG
decoder): a rerun into a folder that holds predictions of another model or other options is refused in one line
(predict into a new folder, or pass `overwrite` to replace them), never mixed with them. The step fails only when no input at all
could be read. The first `print_first` predictions are also printed in the classic form, `The image 0.png is
the number 7 with a 99.85 percent confidence.`, then a progress line every few seconds, so that logs of a
job over millions of images stay readable.

On Vertex AI: `vertex_batch_predict` (or `--vertex-model RESOURCE --staging gs://...`) runs a
BatchPredictionJob on a model registered there instead: it builds the JSONL instances file from the same
sources with the same decoding, waits for the job, and writes the same outputs from the job's results.

Where things are: `sources` (what the inputs are, listed and chunked), `decode` (bytes to pixels, the JPEG
header parser, TFRecord reading), `prefetch` (the read-ahead thread), `output` (shards, markers, the combined
files, `PredictResult`), `local` (`predict`, the loop on this machine), `vertex` (the BatchPredictionJob path),
`samples` (sample inputs), `cli` (the command line and the options `pipectl predict` shares), `nvjpeg` (JPEGs
decoded on the GPU where torchvision can, said in the log; `--cpu-decode` turns it off).
"""

from components.predict.cli import add_arguments, main, predict_from_args
from components.predict.local import predict
from components.predict.output import PredictResult
from components.predict.samples import export_samples
from components.predict.vertex import VertexBatchError, run_vertex_batch_job, vertex_batch_predict

__all__ = ["PredictResult", "VertexBatchError", "add_arguments", "export_samples", "main", "predict",
           "predict_from_args", "run_vertex_batch_job", "vertex_batch_predict"]
