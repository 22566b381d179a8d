"""The fused dense step in C (dense_kernel.c), compiled at first use.

A dense step u + h·(scale_out·sigmoid(K u + b) + shift) as torch operations
is five passes over the state (GEMM into a broadcast bias, sigmoid, Euler
update, shift) plus their dispatch; the C kernel makes one, with the width
unrolled into a vectorised batch loop: 40 µs instead of 70 µs per float64
state of 8 × 5000 here.  It is built with the system C compiler (`$CC`, else
`cc`, about 2 s) for this CPU into `$LPTRAIN_KERNEL_CACHE` (default
~/.cache/lptrain/kernels), keyed by source, flags and CPU, and is used for
CPU float64 states with contiguous rows, widths 2, 4, 8 and 16 (wider
states are GEMM-bound, where MKL does better), outside autograd.  Anything
else, a missing compiler, or LPTRAIN_KERNELS=0 takes the torch path (the
same results to rounding: the kernel's sigmoid is within 2 ulp of torch's).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("dense_kernel.c")
# no -ffast-math: its reassociation would break the rounding trick in the exponential
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
         "-ffinite-math-only", "-fno-signed-zeros", "-fopenmp-simd",
         "-mprefer-vector-width=512", "-shared", "-fPIC")
_state: dict = {}


def load():
    """The compiled library, or None (then `status()` says why)."""
    if "lib" not in _state:
        _state["lib"], _state["why"] = _load()
    return _state["lib"]


def supports(width: int) -> bool:
    lib = load()
    return lib is not None and bool(lib.lp_supported_width(width))


def status() -> str:
    load()
    return "C kernel" if _state["lib"] is not None else f"torch ops ({_state['why']})"


def _load():
    if os.environ.get("LPTRAIN_KERNELS", "1") == "0":
        return None, "LPTRAIN_KERNELS=0"
    cc = os.environ.get("CC", "cc")
    try:
        key = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc,) + FLAGS).encode()
                             + _cpu_id().encode()).hexdigest()[:16]
        cache = Path(os.environ.get("LPTRAIN_KERNEL_CACHE")
                     or Path.home() / ".cache" / "lptrain" / "kernels")
        path = cache / f"dense_kernel-{key}.so"
        if not path.exists():
            _compile(cc, cache, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    lib.lp_dense_sigmoid_step.restype = ctypes.c_int
    lib.lp_dense_sigmoid_step.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long] + \
        [ctypes.c_void_p, ctypes.c_long] * 2 + [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + \
        [ctypes.c_void_p] * 2 + [ctypes.c_void_p, ctypes.c_long] * 2
    lib.lp_supported_width.argtypes = [ctypes.c_int]
    return lib, None


def _compile(cc: str, cache: Path, path: Path):
    """Into a private file first: ranks starting together each get a whole library."""
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], check=True, timeout=120,
                       capture_output=True, text=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def dense_sigmoid_step(u, K, b, h, scale: float, shift: float, save=None, out=None):
    """u + h·(scale·s + shift) with s = sigmoid(K u + b) (and s into `save`), or None
    when the kernel does not apply and the caller takes the torch path.

    u, out, save: (w, B) or (m, w, B) with contiguous rows; K (…, w, w), b (…, w)
    or (…, 1); h: a float or an (m,) tensor.
    """
    lib = load()
    if lib is None or u.dtype != torch.float64 or u.device.type != "cpu" or \
            u.dim() not in (2, 3) or not lib.lp_supported_width(u.shape[-2]):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (u, K, b)):
        return None
    m = u.shape[0] if u.dim() == 3 else 1
    w, B = u.shape[-2], u.shape[-1]
    if out is None:
        out = torch.empty(u.shape, dtype=u.dtype)
    parts = (u, out) if save is None else (u, out, save)
    if not all(_rows(t, u.shape) for t in parts) or not _matrices(K, b, m, w) or \
            _overlap(u, out) or (save is not None and (_overlap(save, out) or _overlap(save, u))):
        return None
    hs = h.tolist() if isinstance(h, torch.Tensor) else [float(h)] * m
    av = (ctypes.c_double * m)(*[x * scale for x in hs])
    cv = (ctypes.c_double * m)(*[x * shift for x in hs])
    st = u.dim() == 3
    lib.lp_dense_sigmoid_step(
        m, w, B, u.data_ptr(), _lead(u, st), K.data_ptr(), _lead(K, st), b.data_ptr(),
        _lead(b, st), 0 if b.shape[-1] == 1 else b.stride(-1), av, cv, out.data_ptr(),
        _lead(out, st), None if save is None else save.data_ptr(),
        0 if save is None else _lead(save, st))
    return out


def _rows(t, shape) -> bool:
    return t.dtype == torch.float64 and t.device.type == "cpu" and t.shape == shape and \
        t.stride(-1) == 1 and t.stride(-2) == shape[-1]


def _matrices(K, b, m: int, w: int) -> bool:
    stacked = K.dim() == 3
    return K.dtype == b.dtype == torch.float64 and K.device.type == b.device.type == "cpu" \
        and K.shape[-2:] == (w, w) and K.stride(-1) == 1 and K.stride(-2) == w \
        and (not stacked or K.shape[0] == m) and b.dim() == K.dim() - 1 \
        and b.shape[-1] in (1, w) and (not stacked or b.shape[0] == m) \
        and (m == 1 or stacked)


def _lead(t, stacked: bool) -> int:
    """Elements between consecutive states or their weights (0 for a single one)."""
    return t.stride(0) if stacked else 0


def _overlap(x, y) -> bool:
    """Whether states of x and y share memory (x, y: like u, rows contiguous).

    Stacks of every c-th state of one buffer interleave without sharing any
    state: with equal strides s between states of L elements, a state of x
    meets one of y iff their distance d is within L of a multiple k·s, |k| < m.
    """
    L = x.shape[-2] * x.shape[-1]
    d = (y.data_ptr() - x.data_ptr()) // x.element_size()
    if x.dim() == 2 or (x.stride(0) == y.stride(0) and x.stride(0) >= L):
        m, step = (1, 0) if x.dim() == 2 else (x.shape[0], x.stride(0))
        return any(abs(d - k * step) < L for k in range(-m + 1, m))
    (a0, a1), (b0, b1) = _span(x), _span(y)
    return a0 < b1 and b0 < a1


def _span(t) -> tuple[int, int]:
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()
