"""Check, without a GPU, that a GPU image's CUDA libraries load: each by its soname, from the dynamic linker's paths.

The GPU images install CUDA, cuDNN and NCCL as NVIDIA's wheels (site-packages/nvidia/*/lib), not as system
packages. A framework finds some of them through its own RUNPATH and misses others: TensorFlow 2.21's RUNPATH
names cublas, cudnn, cufft, cusparse, cupti, nccl and cuda_runtime but not cusolver, nvjitlink, curand or
nvrtc, and PyTorch's libraries carry no RUNPATH at all. A library that does not load leaves the framework
without a GPU, with only a log line to say so. So the images register every site-packages/nvidia/*/lib folder
with the dynamic linker, and this check proves the result at build time:

    python3 gpu_libs.py register /etc/ld.so.conf.d/nvidia-wheels.conf && ldconfig
    python3 gpu_libs.py check tensorflow      # or: check torch, check jax

``check`` loads every library the framework loads at run time for the GPU, each by its bare soname in a
process of its own (so that nothing already loaded through a RUNPATH can make it pass), with the one
exception of the driver's libcuda.so.1, which only a GPU node has: a library that needs it and nothing else
missing is reported as waiting for the driver. The dynamic linker names only the first dependency it cannot
find, so a library whose load fails on libcuda.so.1 is loaded again with a stand-in libcuda.so.1 last on the
linker's path (an empty shared object with that soname, written here by ``write_shared_object``: the slim
images have no compiler) and lazy binding (the driver's functions are bound at their first call, which never
comes): only then does a second missing library, or anything else wrong, show. It then compares the CUDA and
cuDNN major versions the framework was built for (``tf.sysconfig.get_build_info()``; ``torch.version.cuda`` and torch's cuDNN compile
version; JAX's CUDA plugin's ``_versions``) with the sonames that loaded. Exit status 0 when all holds, 1 with what failed, 2 on bad usage.

``fit tensorflow`` trains a small Conv2D model for one epoch with ``model.fit()`` under XLA (as training does on a
GPU): TensorFlow 2.21 with cuDNN 9.5 loaded every library and then failed there, in XLA's autotuner ("Autotuner
could not find any supported configs", aws/deep-learning-containers #6417, #6418). At build time there is no
GPU, so it runs on the CPU and proves only that the step runs at all; ``fit tensorflow --require-gpu`` on a GPU
node (docs/cluster-setup.md, "First GPU run") runs it on the GPU, through cuDNN, and fails when TensorFlow
registers no GPU.

The library lists follow each framework's own loader: TensorFlow's DsoLoader
(third_party/xla/xla/tsl/platform/default/dso_loader.cc: cudart, cublas, cublasLt, cufft, cusolver,
cusparse, cupti, cudnn, nccl) plus what cuDNN and cuSOLVER load in turn (cudnn's own sub-libraries, nvrtc,
nvJitLink) and curand; PyTorch's _preload_cuda_deps in torch/__init__.py; JAX's _load_nvidia_libraries
(jax_plugins/xla_cuda13/__init__.py:120-144 in jax-cuda13-pjrt 0.10.2), which loads them by path from
site-packages/nvidia/cu13 and nvidia/cudnn: the soname check proves the same files load. Standard library only,
apart from the framework itself, so that it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile

DRIVER = "libcuda.so.1"

# Library names (the part between "lib" and ".so") each framework loads at run time for the GPU. "cudnn" also
# stands for cuDNN's sub-libraries (libcudnn_ops, libcudnn_cnn, ...), which libcudnn opens by soname itself.
LIBRARIES = {
    "tensorflow": ("cudart", "cublas", "cublasLt", "cufft", "cusolver", "cusparse", "cupti", "cudnn", "nccl",
                   "nvrtc", "nvrtc-builtins", "nvJitLink", "curand"),
    "torch": ("cublasLt", "cublas", "cudnn", "nvrtc", "nvrtc-builtins", "cudart", "cupti", "cufft", "curand",
              "nvJitLink", "cusparse", "cusparseLt", "cusolver", "nccl", "nvshmem_host", "cufile"),
    "jax": ("cudart", "nvrtc", "cublas", "cublasLt", "nccl", "cupti", "cusparse", "cusolver", "cufft",
            "nvshmem_host", "cudnn"),
}

# Run in a child process per library: dlopen by soname alone (binding every symbol now, or with "lazy" each function
# at its first call), then say where the linker found it.
_LOADER = r"""
import ctypes, os, sys
if sys.argv[2:] == ["lazy"]:
    libc = ctypes.CDLL(None)
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    libc.dlerror.restype = ctypes.c_char_p
    if not libc.dlopen(sys.argv[1].encode(), os.RTLD_LAZY | os.RTLD_LOCAL):
        print("error:", libc.dlerror().decode(errors="replace"))
        raise SystemExit(1)
else:
    try:
        ctypes.CDLL(sys.argv[1])
    except OSError as error:
        print("error:", error)
        raise SystemExit(1)
with open("/proc/self/maps") as maps:
    paths = {line.split()[-1] for line in maps if line.rstrip().endswith("/" + sys.argv[1])}
print("loaded:", sorted(paths)[0] if paths else "?")
"""


class CheckError(Exception):
    """Bad usage or an environment the check cannot read; the message says what to do."""


@dataclasses.dataclass
class Library:
    soname: str
    status: str  # "loaded", "driver" (needs libcuda.so.1 only) or "failed"
    detail: str  # where it loaded from, or the dynamic linker's error


@dataclasses.dataclass
class Report:
    framework: str
    lib_dirs: list[str]
    libraries: list[Library]
    versions: list[tuple[str, str, str, bool]]  # (what, built for, soname found, match)
    missing: list[str]  # library names with no soname in any folder

    @property
    def ok(self) -> bool:
        return (not self.missing and all(lib.status != "failed" for lib in self.libraries)
                and all(match for *_, match in self.versions))

    def lines(self) -> list[str]:
        width = max((len(lib.soname) for lib in self.libraries), default=10)
        out = [f"{self.framework}: {len(self.lib_dirs)} NVIDIA library folders"]
        for lib in self.libraries:
            state = {"loaded": "loaded  ", "driver": "driver  ", "failed": "FAILED  "}[lib.status]
            out.append(f"  {state}{lib.soname:<{width}}  {lib.detail}")
        for name in self.missing:
            out.append(f"  MISSING lib{name}.so.*  in no site-packages/nvidia/*/lib folder: is the extra installed?")
        for what, built, found, match in self.versions:
            out.append(f"  {'match   ' if match else 'MISMATCH'}{what}: built for {built}, loads {found}")
        out.append("ok" if self.ok else "FAILED: the GPU would not be registered; see the lines above")
        return out


def site_dirs() -> list[str]:
    """This interpreter's site-packages folders (where pip put the NVIDIA wheels)."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return list(dict.fromkeys(os.path.realpath(d) for d in dirs if os.path.isdir(d)))


def nvidia_lib_dirs(sites: list[str]) -> list[str]:
    """Every site-packages/nvidia/*/lib folder (CUDA 13 wheels share nvidia/cu13/lib)."""
    found = []
    for directory in sites:
        found += sorted(glob.glob(os.path.join(directory, "nvidia", "*", "lib")))
    return found


def sonames(name: str, lib_dirs: list[str]) -> list[str]:
    """The sonames of library ``name`` in the folders: wheels ship each library once, named by its soname."""
    if name == "cudnn":
        pattern = re.compile(r"libcudnn(_[a-z_]+)?\.so\.\d+")
    else:
        pattern = re.compile(rf"lib{re.escape(name)}\.so\.\d+(\.\d+)*")
    names = {entry for directory in lib_dirs for entry in os.listdir(directory) if pattern.fullmatch(entry)}
    return sorted(names)


def write_shared_object(path: str, soname: str, needed: tuple[str, ...] = ()) -> None:
    """An ELF shared object that defines nothing: its soname, the libraries it needs, and what the dynamic linker
    requires of any object (a dynamic section, a symbol and a hash table, each empty but for the null symbol; a
    non-executable stack, without which glibc 2.41 refuses to dlopen it). For this interpreter's machine (read
    from its own ELF header), 64-bit little-endian: x86-64 and arm64."""
    with open(os.path.realpath(sys.executable), "rb") as f:
        header = f.read(64)
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise CheckError(f"{sys.executable} is not a 64-bit little-endian ELF program: the stand-in libcuda.so.1 "
                         f"is written for those only")
    machine, = struct.unpack_from("<H", header, 18)
    flags, = struct.unpack_from("<I", header, 48)
    names = (soname, *needed)
    strtab = b"\0" + b"".join(name.encode() + b"\0" for name in names)
    offsets = {}
    position = 1
    for name in names:
        offsets[name] = position
        position += len(name.encode()) + 1
    header_size, program_header_size, program_headers = 64, 56, 3
    symtab_at = header_size + program_header_size * program_headers
    hash_at = symtab_at + 24  # one Elf64_Sym, the null symbol
    strtab_at = hash_at + 16  # DT_HASH: nbucket 1, nchain 1, bucket[0] 0, chain[0] 0
    dynamic_at = (strtab_at + len(strtab) + 7) // 8 * 8
    dt_needed, dt_hash, dt_strtab, dt_symtab, dt_strsz, dt_syment, dt_soname = 1, 4, 5, 6, 10, 11, 14
    entries = [(dt_needed, offsets[name]) for name in needed] + [
        (dt_soname, offsets[soname]), (dt_hash, hash_at), (dt_strtab, strtab_at), (dt_symtab, symtab_at),
        (dt_strsz, len(strtab)), (dt_syment, 24), (0, 0)]
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    size = dynamic_at + len(dynamic)
    pt_load, pt_dynamic, pt_gnu_stack, pf_r, pf_w = 1, 2, 0x6474E551, 4, 2
    ident = b"\x7fELF" + bytes([2, 1, 1, header[7], header[8]]) + bytes(7)
    elf_header = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, header_size, 0, flags, header_size,
                                     program_header_size, program_headers, 64, 0, 0)
    program = (struct.pack("<IIQQQQQQ", pt_load, pf_r | pf_w, 0, 0, 0, size, size, 0x1000)
               + struct.pack("<IIQQQQQQ", pt_dynamic, pf_r | pf_w, dynamic_at, dynamic_at, dynamic_at,
                             len(dynamic), len(dynamic), 8)
               + struct.pack("<IIQQQQQQ", pt_gnu_stack, pf_r | pf_w, 0, 0, 0, 0, 0, 16))
    body = elf_header + program + bytes(24) + struct.pack("<IIII", 1, 1, 0, 0) + strtab
    with open(path, "wb") as f:
        f.write(body + bytes(dynamic_at - len(body)) + dynamic)


def _run_loader(soname: str, env: dict[str, str] | None, *mode: str) -> tuple[bool, str]:
    result = subprocess.run([sys.executable, "-I", "-c", _LOADER, soname, *mode], capture_output=True, text=True,
                            timeout=120, env=env)
    output = (result.stdout + result.stderr).strip().splitlines()
    message = output[-1] if output else f"exit status {result.returncode}"
    if result.returncode == 0 and message.startswith("loaded: "):
        return True, message.removeprefix("loaded: ")
    return False, message.removeprefix("error: ")


def load(soname: str, env: dict[str, str] | None = None) -> Library:
    """dlopen ``soname`` alone in a fresh interpreter, found only through the linker's paths; where only the
    driver's libcuda.so.1 is missing, again with the stand-in for it, to find whatever else is missing."""
    loaded, detail = _run_loader(soname, env)
    if loaded:
        return Library(soname, "loaded", detail)
    if f"{DRIVER}: cannot open shared object file" not in detail:
        return Library(soname, "failed", detail)
    with tempfile.TemporaryDirectory(prefix="gpu-libs-") as stand_in:
        write_shared_object(os.path.join(stand_in, DRIVER), DRIVER)
        stand_in_env = dict(os.environ if env is None else env)
        # Last on the path: a real libcuda.so.1 found anywhere before it (a GPU node's) is the one that loads.
        stand_in_env["LD_LIBRARY_PATH"] = ":".join(filter(None, [stand_in_env.get("LD_LIBRARY_PATH"), stand_in]))
        loaded, detail = _run_loader(soname, stand_in_env, "lazy")
    if loaded:
        return Library(soname, "driver", f"needs the driver's {DRIVER}, which a GPU node provides")
    return Library(soname, "failed", detail)


def major(version: str | int | None) -> str:
    return str(version).split(".")[0] if version not in (None, "") else "?"


def soname_major(soname_list: list[str], stem: str) -> str:
    for soname in soname_list:
        match = re.fullmatch(rf"lib{stem}\.so\.(\d+)", soname)
        if match:
            return match.group(1)
    return "none"


def built_versions(framework: str) -> tuple[str, str]:
    """(CUDA, cuDNN) versions the installed framework was built for."""
    if framework == "tensorflow":
        import tensorflow as tf

        info = tf.sysconfig.get_build_info()
        if not info.get("is_cuda_build"):
            raise CheckError("this TensorFlow is not a CUDA build (tensorflow-cpu?): install the [gpu] extra")
        return str(info.get("cuda_version")), str(info.get("cudnn_version"))
    if framework == "jax":
        try:  # the CUDA 13 plugin's version module (jax_cuda13_plugin/_versions.so); it needs no GPU
            from jax_cuda13_plugin import _versions
        except ImportError as e:
            raise CheckError(f"JAX's CUDA 13 plugin does not import ({e}): install the [jax-cuda] extra") from e
        cuda, cudnn = _versions.cuda_runtime_build_version(), _versions.cudnn_build_version()  # 13000, 91200
        return f"{cuda // 1000}.{cuda % 1000 // 10}", f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}"
    import torch

    if not torch.version.cuda:
        raise CheckError(f"torch {torch.__version__} is not a CUDA build: install torch from PyPI, not a +cpu wheel")
    from torch.backends import cudnn

    compiled = cudnn._cudnn.getCompileVersion() if cudnn._cudnn is not None else None
    return str(torch.version.cuda), ".".join(map(str, compiled)) if compiled else "none"


def check(framework: str, sites: list[str] | None = None, env: dict[str, str] | None = None) -> Report:
    if framework not in LIBRARIES:
        raise CheckError(f"unknown framework {framework!r}; known: {', '.join(LIBRARIES)}")
    lib_dirs = nvidia_lib_dirs(sites if sites is not None else site_dirs())
    if not lib_dirs:
        raise CheckError("no site-packages/nvidia/*/lib folder: the NVIDIA wheels are not installed here")
    found, missing = [], []
    for name in LIBRARIES[framework]:
        names = sonames(name, lib_dirs)
        if not names:
            missing.append(name)
        found += [n for n in names if n not in found]
    libraries = [load(soname, env) for soname in found]
    loaded = [lib.soname for lib in libraries if lib.status != "failed"]
    cuda, cudnn = built_versions(framework)
    cudart, libcudnn = soname_major(loaded, "cudart"), soname_major(loaded, "cudnn")
    versions = [("CUDA", cuda, f"libcudart.so.{cudart}", major(cuda) == cudart),
                ("cuDNN", cudnn, f"libcudnn.so.{libcudnn}", major(cudnn) == libcudnn)]
    return Report(framework, lib_dirs, libraries, versions, missing)


def fit_conv2d(require_gpu: bool) -> str:
    """One epoch of a Conv2D + bias + ReLU model with fit() under XLA: the fused cuDNN convolution XLA's autotuner
    has to find a config for on a GPU. Returns the line to print; raises CheckError when it cannot run."""
    import numpy as np
    import tensorflow as tf

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    gpus = tf.config.list_physical_devices("GPU")
    if require_gpu and not gpus:
        raise CheckError("TensorFlow registers no GPU here (is this a GPU node, and did `gpu_libs.py check tensorflow` "
                         "pass?): the Conv2D fit() check needs one")
    rng = np.random.default_rng(0)
    images, labels = rng.random((64, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 64)
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.MaxPooling2D(), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    try:
        loss = model.fit(images, labels, batch_size=32, epochs=1, verbose=0).history["loss"][-1]
    except Exception as e:  # XLA's autotuner and cuDNN fail here with an InternalError naming the HLO
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckError(f"Conv2D fit() failed on {gpus[0].name if gpus else 'the CPU'}: {first[:300]}") from e
    if not np.isfinite(loss):
        raise CheckError(f"Conv2D fit() gave a loss of {loss}")
    where = f"on {len(gpus)} GPU(s)" if gpus else "on the CPU (no GPU here: run it with --require-gpu on a GPU node)"
    return f"Conv2D fit() under XLA: ok {where}, loss {loss:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    register = commands.add_parser("register", help="write the NVIDIA library folders to an ld.so.conf.d file")
    register.add_argument("conf", help="e.g. /etc/ld.so.conf.d/nvidia-wheels.conf; run ldconfig after")
    run = commands.add_parser("check", help="load every CUDA library the framework loads, by soname")
    run.add_argument("framework", choices=sorted(LIBRARIES))
    fit_parser = commands.add_parser("fit", help="train a small Conv2D model with fit() under XLA (on the GPU if any)")
    fit_parser.add_argument("framework", choices=["tensorflow"])
    fit_parser.add_argument("--require-gpu", action="store_true", help="fail when the framework registers no GPU")
    for sub in (register, run):
        sub.add_argument("--site", action="append", metavar="DIR",
                         help="site-packages folder holding nvidia/ (default: this interpreter's)")
    args = parser.parse_args(argv)
    try:
        if args.command == "register":
            lib_dirs = nvidia_lib_dirs(args.site or site_dirs())
            if not lib_dirs:
                raise CheckError("no site-packages/nvidia/*/lib folder to register: are the NVIDIA wheels installed?")
            with open(args.conf, "w") as f:
                f.write("".join(f"{d}\n" for d in lib_dirs))
            print(f"{args.conf}: {len(lib_dirs)} folders")
            return 0
        if args.command == "fit":
            print(fit_conv2d(args.require_gpu))
            return 0
        report = check(args.framework, args.site)
    except CheckError as e:
        print(f"gpu_libs.py: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
