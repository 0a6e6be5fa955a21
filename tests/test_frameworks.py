"""Training on PyTorch (components/train/frameworks): the seam keeps keras and the frameworks out of imports; a
model trained on torch serves from TensorFlow with the same predictions; two torch processes on gloo, interrupted
(SIGTERM on one, SIGKILL on one) and resumed, take exactly the planned steps, as the TensorFlow workers do
(tests/test_distributed.py, tests/test_fault_tolerance.py).

The processes get the variables torchrun gives each worker (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), set here so that the test can stop one of them on its own.
"""

import ast
import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from components import train
from components.dataio import data
from components.train import frameworks
from components.train.model import cpu_has_bf16, precision_for
from tests.conftest import accuracy_of, require_framework
from tests.test_distributed import free_ports
from tests.test_fault_tolerance import Attempt

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_training_step_imports_no_framework_until_it_runs():
    """KERAS_BACKEND must be set before keras is first imported: nothing on the way to the step's entry imports
    keras, TensorFlow, torch or JAX."""
    out = run_python("import sys, components.train, components.train.cli, components.train.frameworks.torch, "
                     "components.train.frameworks.tensorflow, components.train.frameworks.jax, components.ops; "
                     "print(sorted(m for m in ('keras', 'tensorflow', 'torch', 'jax') if m in sys.modules))")
    assert out.strip() == "[]"


def test_a_process_trains_on_one_framework():
    out = run_python("from components.train import frameworks\n"
                     "frameworks.use('tensorflow')\nimport keras\n"
                     "try:\n    frameworks.use('torch')\nexcept RuntimeError as e:\n    print(e)\n")
    assert "Keras is already loaded on its tensorflow backend" in out and "--framework torch" in out
    with pytest.raises(ValueError, match="framework must be one of tensorflow, torch, jax"):
        frameworks.check("mxnet")


@pytest.mark.parametrize("framework", ["tensorflow", "torch", "jax"])
def test_auto_precision_on_a_cpu_and_an_asked_policy_is_honoured(framework):
    """One rule on every framework (model.precision_for): bf16/fp16 on GPUs that compute it fast; on a CPU float32,
    except TensorFlow's bf16 where the CPU has native bf16 (its oneDNN kernels are faster in it; torch's and JAX's
    are slower)."""
    require_framework(framework)
    out = run_python(f"from components.train import frameworks\nframeworks.use({framework!r})\n"
                     f"backend = frameworks.backend_class({framework!r})(None)\nbackend.start(backend.role(None))\n"
                     f"print(repr(backend.gpu_capability()), '|', backend.resolve_precision('auto'), "
                     f"backend.resolve_precision('mixed_bfloat16'), backend.resolve_precision('mixed_float16'))\n",
                     env={"OMP_NUM_THREADS": "1"})
    capability, policies = out.strip().splitlines()[-1].split(" | ")
    capability = ast.literal_eval(capability)  # None here; on a GPU machine, its GPU's (the rule: test_train.py)
    cpu_bf16 = framework == "tensorflow" and cpu_has_bf16()
    expected = ("mixed_bfloat16" if cpu_bf16 else "float32") if capability is None else precision_for("auto", capability)
    assert policies.split() == [expected, "mixed_bfloat16", "mixed_float16"]


def torch_env(rank: int, world: int, port: int) -> dict:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}


# One process of a job on this machine: its backend started as the step starts it, its training input made, the
# input's line and threads printed.
INPUT_SHARE = """
import logging, sys
from components.train import frameworks
from components.train.frameworks import base
from components.train.recipes import RECIPES
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
framework, train_dir = sys.argv[1], sys.argv[2]
frameworks.use(framework)
backend = frameworks.backend_class(framework)(None)
role = backend.role(None)
backend.start(role)
next(backend.batches(base.InputSpec(train_dir, [28, 28, 1], RECIPES["reference"], None, "memory", 2, 32, 4), 0, 0))
print(role.task, "threads", backend.input.train.workers, backend.input.train._pool._max_workers, flush=True)
"""


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="two processes on the CPU: a GPU machine's train "
                                                                   "on its GPUs (check_gpus_visible)")
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_processes_on_one_machine_share_its_cpus_for_their_input(framework, small_dataset, tmp_path):
    """Two processes of a job on this machine (real torchrun; two jax.distributed processes) each decode on its
    share of the CPUs, not on all of them (which oversubscribed the machine twice), and say so once."""
    require_framework(framework)
    from components.dataio.images import available_cpus

    (tmp_path / "input_share.py").write_text(INPUT_SHARE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": REPO_ROOT}
    script = [str(tmp_path / "input_share.py"), framework, small_dataset]
    if framework == "torch":  # torchrun sets LOCAL_WORLD_SIZE=2 in each process
        commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script]]
        envs = [env]
    else:
        address = f"127.0.0.1:{free_ports(1)[0]}"
        commands = [[sys.executable, *script]] * 2
        envs = [{**env, "JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}
                for i in range(2)]
    processes = [subprocess.Popen(command, cwd=REPO_ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for command, e in zip(commands, envs)]
    try:
        out = "".join(process.communicate(timeout=300)[0] for process in processes)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert all(process.returncode == 0 for process in processes), out[-3000:]
    share = max(1, available_cpus() // 2)
    lines = [line for line in out.splitlines() if " threads " in line]
    assert sorted(lines) == [f"{task}/{i} threads {share} {share}" for i in range(2)
                             for task in ["rank" if framework == "torch" else "process"]], out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("train: input on")]
    assert said == [f"train: input on {share} thread(s) ({available_cpus()} CPU(s) shared by 2 process(es) on "
                    "this machine)"] * 2, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_trained_on_torch_or_jax_served_by_tensorflow_with_the_same_predictions(framework, small_dataset, tmp_path):
    require_framework(framework)
    model_dir = str(tmp_path / "model")
    attempt = Attempt(["--framework", framework, "--dataset-dir", small_dataset, "--model-dir", model_dir,
                       "--epochs", "2", "--batch-size", "32", "--tensorboard-dir", str(tmp_path / "logs")])
    assert attempt.finish() == 0, "\n".join(attempt.lines[-20:])
    info = json.load(open(os.path.join(model_dir, train.TRAINING_INFO)))
    assert info["framework"] == framework and info["saved_model"] == "written"
    assert info["steps"] == 2 * info["steps_per_epoch"] and len(info["history"]["val_accuracy"]) == 2
    assert any(f"framework {framework}" in line for line in attempt.lines)
    assert os.listdir(tmp_path / "logs")[0].startswith("events.out.tfevents.")

    images, _ = data.load_split_arrays(small_dataset, "test", limit=64)
    np.save(tmp_path / "images.npy", images.astype("float32"))
    # The model on the framework that trained it ...
    run_python(f"import numpy as np, keras\nm = keras.models.load_model({model_dir + '/model.keras'!r})\n"
               f"np.save({str(tmp_path / 'torch.npy')!r}, keras.ops.convert_to_numpy(keras.ops.softmax("
               f"m(np.load({str(tmp_path / 'images.npy')!r}), training=False))))", env={"KERAS_BACKEND": framework})
    # ... and the SavedModel on TensorFlow, as Vertex AI's TensorFlow serving containers load it.
    import tensorflow as tf

    serve = tf.saved_model.load(os.path.join(model_dir, "saved_model")).signatures["serving_default"]
    served = list(serve(tf.constant(np.load(tmp_path / "images.npy"))).values())[0].numpy()
    on_torch = np.load(tmp_path / "torch.npy")
    np.testing.assert_allclose(served, on_torch, atol=1e-5)
    assert accuracy_of(model_dir, small_dataset) > 0.6


@pytest.mark.slow
def test_two_torch_processes_interrupted_resume_to_the_exact_step_count(small_dataset, tmp_path):
    """Two processes on gloo: SIGTERM on rank 1 (both save at the same step and exit EXIT_RETRY), then SIGKILL on
    rank 1 (rank 0 loses its peer in the all-reduce: EXIT_RETRY, resumed from the last periodic checkpoint), then
    both run to the end: exactly epochs x steps_per_epoch steps, a mid-epoch resume, and a working model."""
    require_framework("torch")
    epochs, batch = 6, 16  # six: on an idle machine three epochs ended before the second signal arrived
    args = ["--framework", "torch", "--dataset-dir", small_dataset, "--epochs", str(epochs), "--batch-size",
            str(batch), "--input-mode", "memory", "--model-dir", str(tmp_path / "model"), "--backup-dir",
            str(tmp_path / "backup"), "--checkpoint-seconds", "0.5"]

    def start() -> list[Attempt]:
        port = free_ports(1)[0]
        return [Attempt(args, env=torch_env(rank, 2, port)) for rank in range(2)]

    def stop(workers: list[Attempt]) -> None:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()

    resumes, last_saved = [], 0
    for kill in (signal.SIGTERM, signal.SIGKILL):
        workers = start()
        try:
            assert workers[0].wait_for_checkpoints(2, timeout=300), "\n".join(workers[0].lines[-20:])
            workers[1].process.send_signal(kill)
            codes = [worker.finish(timeout=300) for worker in workers]
        finally:
            stop(workers)
        log = "\n".join(workers[0].lines[-20:])
        assert workers[0].resumed_from() == last_saved, log
        resumes.append(workers[0].resumed_from())
        assert codes[0] == train.EXIT_RETRY, log
        if kill == signal.SIGTERM:
            assert codes[1] == train.EXIT_RETRY
            assert any("(preempted)" in line for line in workers[0].lines), log
        else:
            assert codes[1] == -signal.SIGKILL
            assert "Lost contact with a peer worker in step" in log, log
        assert not os.path.exists(tmp_path / "backup" / train.FAILED_MARKER)
        last_saved = workers[0].saved_steps()[-1]

    workers = start()
    try:
        codes = [worker.finish(timeout=600) for worker in workers]
    finally:
        stop(workers)
    assert codes == [0, 0], "\n".join(workers[0].lines[-20:] + workers[1].lines[-20:])
    assert workers[0].resumed_from() == last_saved > 0
    resumes.append(last_saved)
    info = json.load(open(tmp_path / "model" / train.TRAINING_INFO))
    assert info["workers"] == info["replicas"] == 2 and info["global_batch_size"] == 2 * batch
    assert info["steps"] == epochs * info["steps_per_epoch"]
    assert all(len(values) == epochs for values in info["history"].values())
    assert any(step % info["steps_per_epoch"] for step in resumes), f"no mid-epoch resume in {resumes}"
    assert accuracy_of(str(tmp_path / "model"), small_dataset) > 0.6


@pytest.mark.slow
def test_two_jax_processes_preempted_resume_to_the_exact_step_count(small_dataset, tmp_path):
    """Two JAX processes (jax.distributed, gloo): SIGTERM on process 1, both save at the same step and exit
    EXIT_RETRY; started again, they resume there and take exactly epochs x steps_per_epoch steps."""
    require_framework("jax")
    epochs, batch = 4, 16  # room for the signal after the first checkpoint on an idle machine
    args = ["--framework", "jax", "--dataset-dir", small_dataset, "--epochs", str(epochs), "--batch-size",
            str(batch), "--input-mode", "memory", "--model-dir", str(tmp_path / "model"), "--backup-dir",
            str(tmp_path / "backup"), "--checkpoint-seconds", "0.5"]

    def start() -> list[Attempt]:
        address = f"127.0.0.1:{free_ports(1)[0]}"
        return [Attempt(args, env={"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": "2",
                                   "JAX_PROCESS_ID": str(index), "OMP_NUM_THREADS": "1"}) for index in range(2)]

    workers = start()
    try:
        assert workers[0].wait_for_checkpoints(1, timeout=300), "\n".join(workers[0].lines[-20:])
        workers[1].process.send_signal(signal.SIGTERM)
        codes = [worker.finish(timeout=300) for worker in workers]
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
    assert codes == [train.EXIT_RETRY] * 2, "\n".join(workers[0].lines[-20:] + workers[1].lines[-20:])
    assert any("(preempted)" in line for line in workers[0].lines)
    preempted_at = workers[0].saved_steps()[-1]

    workers = start()
    try:
        codes = [worker.finish(timeout=600) for worker in workers]
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
    assert codes == [0, 0], "\n".join(workers[0].lines[-20:] + workers[1].lines[-20:])
    assert workers[0].resumed_from() == preempted_at > 0
    info = json.load(open(tmp_path / "model" / train.TRAINING_INFO))
    assert info["framework"] == "jax" and info["workers"] == info["replicas"] == 2
    assert info["steps"] == epochs * info["steps_per_epoch"] and info["resumed_from_step"] == preempted_at
    assert all(len(values) == epochs for values in info["history"].values())
    assert accuracy_of(str(tmp_path / "model"), small_dataset) > 0.6


def test_event_files_without_tensorflow_are_read_by_tensorflow(tmp_path):
    """The non-TensorFlow frameworks' TensorBoard writer (frameworks/events.py) writes what TensorFlow reads."""
    from components.train.frameworks.events import EventWriter

    writer = EventWriter(str(tmp_path))
    writer.scalar("epoch_loss", 0.5, 10)
    writer.scalar("epoch_loss", 0.25, 20)
    writer.flush()
    assert EventWriter(None).scalar("x", 1.0, 1) is None  # a non-chief's: writes nothing
    import tensorflow as tf

    (path,) = [str(p) for p in tmp_path.iterdir()]
    scalars = [(event.step, value.tag, value.simple_value) for event in tf.compat.v1.train.summary_iterator(path)
               for value in event.summary.value]
    assert scalars == [(10, "epoch_loss", 0.5), (20, "epoch_loss", 0.25)]


def test_local_files_without_tensorflow(tmp_path):
    from components.dataio import storage

    files = storage.LocalFiles
    files.makedirs(str(tmp_path / "a" / "b"))
    with files.GFile(str(tmp_path / "a" / "b" / "x.json"), "w") as f:
        f.write("{}")
    files.copy(str(tmp_path / "a" / "b" / "x.json"), str(tmp_path / "y.json"))
    with pytest.raises(FileExistsError):
        files.copy(str(tmp_path / "y.json"), str(tmp_path / "a" / "b" / "x.json"))
    files.rename(str(tmp_path / "y.json"), str(tmp_path / "z.json"), overwrite=True)
    assert files.glob(str(tmp_path / "*.json")) == [str(tmp_path / "z.json")]
    assert files.exists(str(tmp_path / "z.json")) and files.isdir(str(tmp_path / "a"))
    files.remove(str(tmp_path / "z.json"))
    assert not files.exists(str(tmp_path / "z.json"))
    try:
        storage.use_tensorflow_io(False)
        assert storage.gfile() is storage.LocalFiles
    finally:
        storage.use_tensorflow_io(True)


def test_numpy_checkpoint_round_trip_keeps_the_newest_two(tmp_path):
    """Every model and optimizer variable, the extras and the random state come back as saved; a different model
    is refused."""
    out = run_python(f"""
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, keras
from components.train.frameworks.portable import NumpyCheckpoint
def make():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])
    o = keras.optimizers.Adam(1e-3); o.build(m.trainable_variables)
    return m, o
rng = {{"torch": np.arange(5, dtype=np.uint8)}}
got = {{}}
model, opt = make()
ckpt = NumpyCheckpoint(model, {{"optimizer": opt}}, backup_dir={str(tmp_path)!r}, checkpoint_dir={str(tmp_path)!r},
                       rng_state=lambda: rng, set_rng_state=got.update)
opt.iterations.assign(7)
for step in (1, 2, 3):
    ckpt.save(step, {{"epoch_sums": np.array([1.5, 2.0, 3.0]), "history": "{{}}", "setup": "s", "best": "{{}}"}})
print(sorted(os.listdir({str(tmp_path)!r})))
fresh, fresh_opt = make()
loaded = NumpyCheckpoint(fresh, {{"optimizer": fresh_opt}}, backup_dir={str(tmp_path)!r},
                         checkpoint_dir={str(tmp_path)!r}, rng_state=dict, set_rng_state=got.update)
path, extras = loaded.restore_latest()
same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.variables, fresh.variables))
print(os.path.basename(path), extras["epoch_sums"], extras["setup"], int(fresh_opt.iterations.numpy()), same,
      got["torch"].tolist())
other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
try:
    NumpyCheckpoint(other, {{}}, backup_dir={str(tmp_path)!r}, checkpoint_dir={str(tmp_path)!r}, rng_state=dict,
                    set_rng_state=got.update).restore_latest()
except ValueError as e:
    print("refused:", str(e))
""")
    lines = out.strip().splitlines()
    assert lines[0] == "['ckpt-2.npz', 'ckpt-3.npz']"
    assert lines[1] == "ckpt-3.npz [1.5, 2.0, 3.0] s 7 True [0, 1, 2, 3, 4]"
    assert lines[2].startswith("refused: ") and "model variables, this model has 2: use a new backup" in lines[2]


@pytest.mark.slow
def test_torch_trains_where_tensorflow_is_not_installed_and_the_savedmodel_is_completed_later(small_dataset,
                                                                                               tmp_path):
    """TensorFlow made unimportable (a package of that name that raises ImportError comes first on the path):
    training on torch reads the shards, trains, logs and writes model.keras; the SavedModel is left pending, and
    `python -m components.train.export` where TensorFlow is completes it."""
    require_framework("torch")
    shadow = tmp_path / "no-tensorflow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('TensorFlow is not installed here')\n")
    model_dir = tmp_path / "model"
    attempt = Attempt(["--framework", "torch", "--dataset-dir", small_dataset, "--model-dir", str(model_dir),
                       "--epochs", "1", "--batch-size", "32", "--tensorboard-dir", str(tmp_path / "logs")],
                      env={"PYTHONPATH": os.pathsep.join([str(shadow.parent), REPO_ROOT])})
    assert attempt.finish() == 0, "\n".join(attempt.lines[-20:])
    info = json.load(open(model_dir / train.TRAINING_INFO))
    assert info["framework"] == "torch" and info["saved_model"] == "pending"
    assert (model_dir / "saved_model.pending.json").exists() and not (model_dir / "saved_model").exists()
    done = subprocess.run([sys.executable, "-m", "components.train.export", str(model_dir)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (model_dir / "saved_model" / "saved_model.pb").exists()
    assert not (model_dir / "saved_model.pending.json").exists()
