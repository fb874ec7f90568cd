"""CPU kernels in C for the training steps ATen has no fused kernel for and for the tables' draw, built on first
use with the machine's C compiler and loaded with ctypes.

The source lies beside this file. It is compiled once per source, compiler and CPU with ``-O3 -march=native
-fopenmp`` into ``$XDG_CACHE_HOME/ctrkit/native`` (``~/.cache/ctrkit/native``), written under a temporary name
and renamed, so concurrent processes (a torchrun job's ranks) never load a half-written library. Its SHA-256,
written beside it at build time, is checked before every load: a cached library damaged since (truncated,
replaced) is rebuilt with one line on stderr, never loaded. The library
links the OpenMP runtime torch has already loaded (``libgomp.so.1``), so its parallel loops share torch's
threads and follow ``torch.set_num_threads``. Below ``GRAIN`` values a kernel runs on one thread (the build
defines it as ``CTRKIT_GRAIN``).

Where no compiler works (or ``CTRKIT_NATIVE=0``), ``library()`` returns None and callers keep their ATen
operations; the reason is said once on stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch  # loads torch's OpenMP runtime (libgomp.so.1) before the library that links it

SOURCES = ("interaction.c", "rows.c", "mlp.c", "draw.c")
HEADERS = ("bf16.h",)  # included by the sources: part of the build's cache key
# values below which a kernel runs on one thread, as ATen's grain: waking sleeping OpenMP threads costs more
# (docs/decisions/omp-wait-policy.md)
GRAIN = 32768
# -fno-math-errno: sqrtf need not set errno (nothing reads it), so the row optimizers' square roots and divisions are
# vector instructions, not one scalar sqrtss and two divss an element behind an errno branch (the same bits)
FLAGS = (
    "-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
    f"-DCTRKIT_GRAIN={GRAIN}",
)  # fmt: skip
_P, _I, _C, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
_U, _F = ctypes.c_uint64, ctypes.c_float
SIGNATURES = {
    "ctrkit_rows_adam_f32": [*[_P] * 7, _I, _I, _I, _D, _D, _D, _D, _D],
    "ctrkit_rows_adagrad_f32": [*[_P] * 6, _I, _I, _I, _D, _D],
    "ctrkit_rows_sgd_f32": [_P, _P, _P, _I, _I, _I, _D],
    "ctrkit_gather_rows_f32": [_P, _I, _P, _P, _I, _I, _I, _P, _P],
    "ctrkit_sort_ids": [_P, _I, _I, _P, _P, _P, _P],
    "ctrkit_draw_uniform_f32": [_P, _I, _I, _I, _U, _I, _I, _I, _F],
    "ctrkit_bias_relu_f32": [_P, _P, _I, _I],
    "ctrkit_relu_backward_bias_f32": [_P, _P, _P, _P, _I, _I],
    "ctrkit_relu_backward_bias_bf16": [_P, _P, _P, _P, _I, _I],
    **{f"ctrkit_dot_forward_{k}": [_P, _P, _P, _I, _I, _I, _I, _C] for k in ("f32", "bf16_f32", "bf16")},
    **{f"ctrkit_dot_backward_{k}": [_P, _P, _P, _P, _P, _I, _I, _I, _I, _C] for k in ("f32", "bf16_f32", "bf16")},
}

RETURNS = {"ctrkit_rows_sgd_f32": _I, "ctrkit_gather_rows_f32": _I, "ctrkit_sort_ids": _I}  # the others return nothing
_loaded: list = []  # [library or None], once per process
_loading = threading.Lock()  # one thread builds and loads it
_suspended: list = []  # non-empty inside suspended()


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))  # the first core's lines (every core repeats them)


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ctrkit" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str, flags: Sequence[str], here: Path | None = None) -> Path:
    """Compiles the sources (in ``here``, default this package's) with ``flags``, if this source/compiler/flags/CPU has
    not been built before, and returns the library."""
    here = Path(__file__).parent if here is None else Path(here)
    source = "".join((here / s).read_text() for s in (*SOURCES, *HEADERS))
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([source, version, " ".join(flags), _cpu_identity()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"libctrkit_native_{key}.so"
    if out.exists():
        problem = _check_entry(out)
        if problem is None:
            return out
        print(f"ctrkit: native kernel cache entry {out} {problem}; rebuilding it", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", tmp, *(str(here / s) for s in SOURCES), "-lm"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        # the digest first, then the library: a process that finds the library finds its digest
        fd, tmp_digest = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
        with os.fdopen(fd, "w") as f:
            f.write(_digest(Path(tmp)) + "\n")
        os.replace(tmp_digest, _digest_file(out))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _digest_file(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_entry(library: Path) -> str | None:
    """None when the cached ``library`` is the file its build wrote (the SHA-256 recorded beside it at build
    time), else what is wrong: dlopen of a truncated library (a disk that filled during a copy, a partial
    sync) is not an error but a SIGBUS on first use, so nothing is loaded unchecked."""
    try:
        recorded = _digest_file(library).read_text().strip()
    except OSError:
        return "has no recorded digest"
    try:
        actual = _digest(library)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None if actual == recorded else "does not match the digest recorded when it was built"


def build(flags: Sequence[str] | None = None) -> ctypes.CDLL:
    """The kernels compiled with ``flags`` (default ``FLAGS``) and loaded, their signatures set; cached per source
    text, compiler, flags and CPU. ``library()`` is the process's own build. Raises RuntimeError where no compiler
    is found or the build fails."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (cc, gcc or clang; or set CC)")
    path = _build(compiler, FLAGS if flags is None else flags)
    lib = ctypes.CDLL(str(path))
    for name, args in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise RuntimeError(f"{path} lacks the kernel {name}; delete it to rebuild") from None
        fn.argtypes, fn.restype = args, RETURNS.get(name)
    return lib


def _load() -> ctypes.CDLL | None:
    return None if os.environ.get("CTRKIT_NATIVE", "1") == "0" else build()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Inside, ``library()`` is None: the ATen operations run (for torch's FLOP counter, which counts only ATen's
    matrix multiplies)."""
    _suspended.append(True)
    try:
        yield
    finally:
        _suspended.pop()


def scoring_eagerly() -> bool:
    """Inference without autograd outside every exporter's trace (TorchScript, the ONNX exporter, torch.compile
    and torch.export): where a model may take ctrkit's kernels for its forward though it is not training. Exports
    record ATen's operations, which every runtime knows."""
    if torch.is_grad_enabled() or torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    return not (torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export())


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (said once on stderr), with ``CTRKIT_NATIVE=0`` or
    inside ``suspended()``."""
    if _suspended:
        return None
    if not _loaded:
        with _loading:  # threads scoring or stepping their slices may ask first at once: one builds and says
            if not _loaded:
                try:
                    lib = _load()
                except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                    print(f"ctrkit: native CPU kernels unavailable ({err}); using ATen operations", file=sys.stderr)
                    lib = None
                _loaded.append(lib)
    return _loaded[0]
