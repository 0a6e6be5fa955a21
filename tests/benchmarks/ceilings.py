"""Every hot path against its own ceiling, measured in the same run: ours, the ceiling and the share.

    python -m tests.benchmarks.ceilings [--camera 390] [--small 2000] [--pngs 10000] [--repeats 2] [--paths ...]

A ceiling is the rate of the work a path cannot avoid, done alone with every CPU the step may use
(`components.dataio.images.available_cpus()`), nothing else running in the process: reading every file's bytes, decoding
them, and for prediction the model's own compute. For a path that must do several of these, each is timed alone
with every core and their times are summed (the CPU time of each divided by the cores, when each keeps the cores
busy): ceiling = files / (read seconds + decode seconds [+ model seconds]). The share is ours / the ceiling; the
goal is 0.8. docs/benchmarks.md gives each definition; they are fixed here so that the denominator cannot drift
toward the numerator:

  - reading: every file's bytes with plain open/read, one thread per CPU, each a run of consecutive files (the
    files are in the page cache after the first pass, as they are for ours);
  - decoding: the faster of two decoders over the bytes already in memory, only the decode (no hashing, records,
    resizing, checks or Python of ours): Pillow with one process per CPU, and TensorFlow's C++ decoders (the
    faster of a tf.data map with one call per CPU and tf.map_fn over batches of 64 with 2 x CPUs parallel
    iterations). At the scale the path must decode:
      - preprocess of a JPEG: 1/8 DCT scale, the entropy decoding every check of a JPEG pays however much else it
        skips (images.decode_source); of a PNG: the whole image;
      - prediction of a JPEG: the smallest DCT scale that keeps both sides >= the model's (the readers' rule,
        data.decode_to_shape), without its resize; of a PNG: the whole image;
  - the model: `Classifier.predict_proba` (the step's own call) on decoded images already in memory, at the
    step's batch size (predict.local.auto_batch_size), TensorFlow's threads as they are.

The paths, each on real images:
  camera preprocess   JPEGs 320x240 to 4000x3000 made from Debian's mate-backgrounds photographs
                      (tests.benchmarks.photos.make_camera_tree) -> preprocess to 224x224 RGB
  camera predict      the same JPEGs -> batch prediction with the photos benchmark's small 224x224 model
  small photos        npm's food photos (307x173 JPEGs, `make photos`), made unique and repeated to --small files
                      (each copy a JPEG comment apart) -> preprocess to 224x224 RGB
  png preprocess      Fashion-MNIST 28x28 PNGs in class folders -> preprocess to 28x28 grayscale
  png predict         the same PNGs -> batch prediction with the reference CNN (untrained: its compute is the same)

Each path runs ours once untimed (imports, tracing, the page cache), then ours and each part of its ceiling,
--repeats times interleaved; the best of each is kept (other work on a shared machine comes and goes). Rates are
files per second. Beside the share of the rates, the CPU share: the ceiling's parts' CPU seconds against ours (this
process's threads and its worker processes), which other work on a shared machine moves less.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time

PATHS = ("camera preprocess", "camera predict", "small photos", "png preprocess", "png predict")
GOAL = 0.8


def files_under(root: str) -> list[str]:
    return [os.path.join(d, n) for d, subdirs, names in sorted(os.walk(root)) for n in sorted(names)]


# ---------------------------------------------------------------------------------------------- the ceiling's parts


def _read_part(paths: list[str]) -> list[bytes]:
    contents = []
    for path in paths:
        with open(path, "rb") as f:
            contents.append(f.read())
    return contents


def read_seconds(paths: list[str], cpus: int) -> tuple[tuple[float, float], list[bytes]]:
    """((seconds, CPU seconds) to read every file's bytes, one thread per CPU, each a run of files; the bytes in
    input order)."""
    step = -(-len(paths) // cpus)
    start, cpu = time.monotonic(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(cpus) as pool:
        parts = list(pool.map(_read_part, [paths[i:i + step] for i in range(0, len(paths), step)]))
    seconds = (time.monotonic() - start, time.process_time() - cpu)
    return seconds, [c for part in parts for c in part]


def _pillow_decode_part(paths: list[str], scale: str, size: int, channels: int) -> tuple[float, float]:
    """In a worker process: reads its files (not timed), then decodes each one as `scale` says; the decode's
    (seconds, CPU seconds). scale "check": 1/8 DCT scale; "rule": the smallest DCT scale keeping both sides
    >= size; "full": the whole image."""
    from PIL import Image

    contents = _read_part(paths)
    mode = "L" if channels == 1 else "RGB"
    start, cpu = time.monotonic(), time.process_time()
    for raw in contents:
        with Image.open(io.BytesIO(raw)) as img:
            if img.format == "JPEG" and scale != "full":  # PIL drafts the largest scale >= the size asked for
                img.draft(mode, (max(1, img.width // 8), max(1, img.height // 8)) if scale == "check" else (size, size))
            img.load()
    return time.monotonic() - start, time.process_time() - cpu


def pillow_decode_seconds(pool: concurrent.futures.Executor, paths: list[str], cpus: int, scale: str, size: int,
                          channels: int) -> tuple[float, float]:
    """Pillow, one process per CPU, each decoding its share of the files from memory: (the slowest share's
    seconds, the shares' CPU seconds summed)."""
    step = -(-len(paths) // cpus)
    futures = [pool.submit(_pillow_decode_part, paths[i:i + step], scale, size, channels)
               for i in range(0, len(paths), step)]
    parts = [f.result() for f in futures]
    return max(p[0] for p in parts), sum(p[1] for p in parts)


def _tensorflow_decode_one(scale: str, size: int, channels: int):
    """File bytes -> the decoded image's shape, decoded by TensorFlow's C++ at the ceiling's scale."""
    import tensorflow as tf

    def one(raw):
        def jpeg():
            if scale == "full":
                return tf.io.decode_jpeg(raw, channels=channels, dct_method="INTEGER_ACCURATE")
            if scale == "check":
                return tf.io.decode_jpeg(raw, channels=channels, ratio=8, dct_method="INTEGER_ACCURATE")
            shape = tf.io.extract_jpeg_shape(raw)
            fits = [tf.reduce_all(tf.math.floordiv(shape[:2] + r - 1, r) >= size) for r in (2, 4, 8)]
            index = tf.add_n([tf.cast(f, tf.int32) for f in fits])
            return tf.switch_case(index, [lambda r=r: tf.io.decode_jpeg(raw, channels=channels, ratio=r,
                                                                        dct_method="INTEGER_ACCURATE")
                                          for r in (1, 2, 4, 8)])

        image = tf.cond(tf.equal(tf.strings.substr(raw, 0, 3), b"\xff\xd8\xff"), jpeg,
                        lambda: tf.io.decode_png(raw, channels=channels))
        return tf.shape(image)  # the pixels are decoded; only their shape leaves the map

    return one


def tensorflow_decode_seconds(contents: list[bytes], cpus: int, scale: str, size: int,
                              channels: int) -> tuple[float, float]:
    """(seconds, CPU seconds) of TensorFlow's C++ decoders over the files in memory, at the scale
    `pillow_decode_seconds` uses (PNGs whole), the faster of two ways of running them in parallel: a tf.data map
    with one call per CPU (as a training input decodes), and tf.map_fn over batches of 64 with 2 x CPUs parallel
    iterations (as batch prediction decodes; on camera photos the switch between DCT scales ran it at one core
    in batches of 256). Each is built and run once on a few files before the clock starts."""
    import tensorflow as tf

    one = _tensorflow_decode_one(scale, size, channels)
    tensor = tf.constant(contents)
    dataset = tf.data.Dataset.from_tensor_slices(tensor).map(one, num_parallel_calls=cpus, deterministic=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def batch(files):
        return tf.map_fn(one, files, fn_output_signature=tf.int32, parallel_iterations=2 * cpus)

    for _ in dataset.take(4):
        pass
    batch(tensor[:4])
    timed = []
    for run in (lambda: [None for _ in dataset],
                lambda: [batch(tensor[i:i + 64]).numpy() for i in range(0, len(contents), 64)]):
        start, cpu = time.monotonic(), time.process_time()
        run()
        timed.append((time.monotonic() - start, time.process_time() - cpu))
    return min(timed)


def model_seconds(classifier, count: int, batch_size: int) -> tuple[float, float]:
    """The model alone: `predict_proba` on `count` images already decoded, in the step's batches (warmed first)."""
    import numpy as np

    images = np.random.default_rng(0).integers(0, 256, [batch_size, *classifier.image_shape], dtype=np.uint8)
    classifier.predict_proba(images)
    start, cpu = time.monotonic(), time.process_time()
    left = count
    while left > 0:
        classifier.predict_proba(images[:min(left, batch_size)])
        left -= batch_size
    return time.monotonic() - start, time.process_time() - cpu


# ---------------------------------------------------------------------------------------------- ours


class TreeCPU:
    """CPU seconds of this process and of the processes below it while the block runs (preprocess's decode
    workers are children of a forkserver, gone when it ends: each is sampled every 20 ms and its last reading
    counted, so a worker's final 20 ms may be missed); processes already running count from the block's start.
    The sampling thread's own CPU is not counted: listing the children reads every process's /proc entry, 1.4 ms
    of CPU a sample on this machine, which was 0.3-0.4 ms a camera photo and 0.005 ms a PNG charged to ours."""

    def __enter__(self):
        import threading

        import psutil

        self._me = psutil.Process()
        self._children: dict[int, float] = {}
        self._sample_children()
        self._initial = dict(self._children)
        self._done = threading.Event()
        self._sampling = 0.0
        self._start = time.process_time()

        def sample():
            start = time.thread_time()
            while not self._done.wait(0.02):
                self._sample_children()
            self._sampling = time.thread_time() - start

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def _sample_children(self) -> None:
        import psutil

        for child in self._me.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.Error:
                continue
            self._children[child.pid] = times.user + times.system

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self._sample_children()
        self.seconds = time.process_time() - self._start - self._sampling + sum(
            cpu - self._initial.get(pid, 0.0) for pid, cpu in self._children.items())
        return False


class PlanLog(logging.Handler):
    """Keeps the decode plan preprocess chose (its log line), which the rates depend on."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.plan = "threads or one worker by rule (under decoding.MEASURE_MIN_INPUTS inputs)"

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "decoding with" in message:
            self.plan = message.split("decoding with ", 1)[1]


def ours_preprocess(root: str, out: str, image_size: int, channels: int) -> tuple[float, float, int, str]:
    """(seconds, CPU seconds of the process tree, inputs, the decode plan) of preprocess."""
    from components import preprocess as pp

    shutil.rmtree(out, ignore_errors=True)
    plan = PlanLog()
    logger = logging.getLogger("components.preprocess.decoding")
    logger.addHandler(plan)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with TreeCPU() as cpu:
            start = time.monotonic()
            result = pp.preprocess(root, out, image_size=image_size, channels=channels, min_shards=2)
            seconds = time.monotonic() - start
    finally:
        logger.removeHandler(plan)
        logger.setLevel(level)
    return seconds, cpu.seconds, sum(result.counts.values()) + result.rejected, plan.plan


def ours_predict(model_dir: str, root: str, out: str, classifier) -> tuple[float, float, int, str]:
    """(seconds, CPU seconds, inputs) of batch prediction."""
    from components.predict import predict

    shutil.rmtree(out, ignore_errors=True)
    with TreeCPU() as cpu, contextlib.redirect_stdout(io.StringIO()):
        start = time.monotonic()
        result = predict(model_dir, root, out, classifier=classifier)
        seconds = time.monotonic() - start
    return seconds, cpu.seconds, result.count + result.errors, ""


# ---------------------------------------------------------------------------------------------- inputs


def png_model(work: str) -> str:
    """The reference CNN for 28x28x1 and Fashion-MNIST's classes, untrained (its compute does not depend on its
    weights), saved as train saves it."""
    import keras

    from components.dataio import data
    from components.train.models import build_model

    model_dir = os.path.join(work, "png-model")
    os.makedirs(model_dir, exist_ok=True)
    keras.utils.set_random_seed(0)
    build_model([28, 28, 1], len(data.FASHION_MNIST_CLASSES)).save(os.path.join(model_dir, "model.keras"))
    with open(os.path.join(model_dir, "training.json"), "w") as f:
        json.dump({"image_shape": [28, 28, 1], "class_names": data.FASHION_MNIST_CLASSES}, f)
    return model_dir


def prepare(path: str, args, cache: str, work: str) -> dict | str:
    """What a path runs on: {root, image_size, channels, decode scale[, model_dir]}, or why it is skipped."""
    from tests.benchmarks import ingest, photos

    if path.startswith("camera"):
        if not photos.real_photos():
            return photos.MISSING
        root = photos.make_camera_tree(os.path.join(cache, f"camera{args.camera}"), args.camera)
        spec = {"root": root, "image_size": photos.IMAGE_SIZE, "channels": 3}
        if path.endswith("predict"):
            return {**spec, "scale": "rule", "model_dir": photos.make_model(os.path.join(work, "camera-model"),
                                                                           sorted(os.listdir(root)))}
        return {**spec, "scale": "check"}
    if path == "small photos":
        from tests import photos as food

        found = food.installed()
        if not found:
            return f"the food photos are not installed under {food.default_dir()}: run `make photos` (npm needed)"
        count = max(args.small, len(files_under(found)))  # every class folder gets copies
        root = photos.make_unique_copies(os.path.join(cache, f"food{count}"), count, found)
        return {"root": root, "image_size": photos.IMAGE_SIZE, "channels": 3, "scale": "check"}
    from components.dataio import data

    if not os.path.exists(os.path.join(data.DEFAULT_SOURCE, "train-images-idx3-ubyte.gz")):
        return f"Fashion-MNIST is not installed under {data.DEFAULT_SOURCE} (make data)"
    root = ingest.make_png_tree(os.path.join(cache, f"png{args.pngs}"), args.pngs)
    spec = {"root": root, "image_size": 28, "channels": 1, "scale": "full"}
    return {**spec, "model_dir": png_model(work)} if path.endswith("predict") else spec


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--camera", type=int, default=390, help="camera JPEGs, 5 per source photo and size (at 156, "
                        "the card's 104 samples, decoded once more, were a third of preprocess)")
    parser.add_argument("--small", type=int, default=2000, help="food photos, made unique, for the small photos")
    parser.add_argument("--pngs", type=int, default=10000, help="Fashion-MNIST PNGs")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs of each part; the best is kept")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of: {', '.join(PATHS)}")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from components.dataio import data
    from components.dataio.images import available_cpus
    from components.predict.local import auto_batch_size

    chosen = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown path(s) {unknown}; known: {', '.join(PATHS)}")
    cpus = available_cpus()
    cache = os.path.join(os.path.expanduser("~"), ".cache", "photos-bench")
    work = tempfile.mkdtemp(prefix="ceilings-bench-")
    results: dict[str, dict] = {}
    pool = concurrent.futures.ProcessPoolExecutor(cpus, mp_context=multiprocessing.get_context("forkserver"))
    try:
        list(pool.map(time.sleep, [0.0] * cpus))  # the workers start before any clock
        for path in chosen:
            spec = prepare(path, args, cache, work)
            if isinstance(spec, str):
                print(f"{path}: skipped: {spec}", flush=True)
                results[path] = {"skipped": spec}
                continue
            paths = files_under(spec["root"])
            print(f"{path}: {len(paths)} files under {spec['root']} ...", flush=True)
            size, channels, scale = spec["image_size"], spec["channels"], spec["scale"]
            classifier = data.load_classifier(spec["model_dir"]) if "model_dir" in spec else None
            runs: dict[str, list[tuple[float, float]]] = {"ours": [], "read": [], "decode pillow": [],
                                                          "decode tensorflow": [], "model": []}
            out = os.path.join(work, "out")
            plans: list[str] = []
            for repeat in range(args.repeats + 1):  # the first, untimed, warms up: imports, tracing, the page cache
                seconds, cpu, inputs, plan = (ours_predict(spec["model_dir"], spec["root"], out, classifier) if classifier
                                        else ours_preprocess(spec["root"], out, size, channels))
                if inputs != len(paths):
                    raise RuntimeError(f"{path}: ours took {inputs} inputs of {len(paths)} files")
                if not repeat:
                    continue
                runs["ours"].append((seconds, cpu))
                if plan:
                    plans.append(plan.split(" (")[0])
                seconds, contents = read_seconds(paths, cpus)
                runs["read"].append(seconds)
                runs["decode pillow"].append(pillow_decode_seconds(pool, paths, cpus, scale, size, channels))
                runs["decode tensorflow"].append(tensorflow_decode_seconds(contents, cpus, scale, size, channels))
                del contents
                if classifier:
                    runs["model"].append(model_seconds(classifier, len(paths),
                                                       auto_batch_size(classifier.image_shape)))
            # the best of the runs of each, wall and CPU apart (the least time is the least disturbed by others)
            wall = {k: min(r[0] for r in v) for k, v in runs.items() if v}
            cpu = {k: min(r[1] for r in v) for k, v in runs.items() if v}
            decoder = "pillow" if wall["decode pillow"] <= wall["decode tensorflow"] else "tensorflow"
            parts = ["read", "decode " + decoder] + (["model"] if classifier else [])
            ceiling = len(paths) / sum(wall[k] for k in parts)
            cpu_decoder = "pillow" if cpu["decode pillow"] <= cpu["decode tensorflow"] else "tensorflow"
            ceiling_cpu = sum(cpu[k] for k in ["read", "decode " + cpu_decoder] + (["model"] if classifier else []))
            ours = len(paths) / wall["ours"]
            results[path] = {"files": len(paths), "ours_per_s": round(ours, 1), "ceiling_per_s": round(ceiling, 1),
                             "share": round(ours / ceiling, 3), "decoder": decoder,
                             "ms": {k: round(v * 1e3, 1) for k, v in wall.items()},
                             "cpu_ms_per_file": {k: round(v / len(paths) * 1e3, 3) for k, v in cpu.items()},
                             "cpu_share": round(ceiling_cpu / cpu["ours"], 3), "decode_plans": plans,
                             "runs": {k: [[round(x, 4) for x in r] for r in v] for k, v in runs.items() if v}}
            print(f"  ours {ours:.0f}/s, ceiling {ceiling:.0f}/s, share {ours / ceiling:.2f} (CPU: ours "
                  f"{cpu['ours'] / len(paths) * 1e3:.3f} ms a file, the ceiling's parts "
                  f"{ceiling_cpu / len(paths) * 1e3:.3f}, share {ceiling_cpu / cpu['ours']:.2f})"
                  + (f"; preprocess decoded with {', then '.join(plans)}" if plans else ""), flush=True)
    finally:
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nEach hot path against its ceiling ({cpus} CPUs; best of {args.repeats} interleaved runs; goal "
          f"{GOAL} of the ceiling)")
    print(f"{'path':18} {'files':>6} {'ours/s':>8} {'ceiling/s':>10} {'share':>6} {'CPU share':>10}   the ceiling's "
          f"parts, ms (read + the faster decoder [+ model])")
    for path, r in results.items():
        if "skipped" in r:
            print(f"{path:18} skipped: {r['skipped']}")
            continue
        ms = r["ms"]
        parts = (f"read {ms['read']:.0f} + decode {ms['decode ' + r['decoder']]:.0f} ({r['decoder']}; pillow "
                 f"{ms['decode pillow']:.0f}, tensorflow {ms['decode tensorflow']:.0f})")
        if "model" in ms:
            parts += f" + model {ms['model']:.0f}"
        print(f"{path:18} {r['files']:6d} {r['ours_per_s']:8.0f} {r['ceiling_per_s']:10.0f} {r['share']:6.2f} "
              f"{r['cpu_share']:10.2f}   {parts}")
    print("share: ours / the ceiling, wall clock; CPU share: the ceiling's parts' CPU time / ours (all threads and "
          "processes), steadier when other work shares the machine")
    return {"cpus": cpus, "goal": GOAL, "paths": results}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
