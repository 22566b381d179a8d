"""The fused dense step in C (dense_kernel.c), compiled at first use.

A dense step u + h·(scale_out·sigmoid(K u + b) + shift) as torch operations
is five passes over the state (GEMM into a broadcast bias, sigmoid, Euler
update, shift) plus their dispatch; the C kernel makes one, with the width
unrolled into a vectorised batch loop (BENCHMARKS.md).  It is built with the
system C compiler (`$CC`, else `cc`) for this CPU into `$LPTRAIN_KERNEL_CACHE` (default
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
# no -ffast-math: its reassociation would break the rounding trick in the exponential,
# and -ffinite-math-only would let a NaN in the weights or states come out finite
# (a diverged run must stay NaN, so that training stops as diverged)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
         "-fno-signed-zeros", "-fopenmp-simd", "-mprefer-vector-width=512", "-shared", "-fPIC")
WIDTHS = frozenset((2, 4, 8, 16))      # those dense_kernel.c instantiates
_state: dict = {}


def load():
    """The compiled library, or None (then `status()` says why)."""
    if "lib" not in _state:
        _state["lib"], _state["why"] = _load()
    return _state["lib"]


def supports(width: int) -> bool:
    return load() is not None and width in WIDTHS


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
        detail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines() or [""]
        return None, f"{type(exc).__name__}: {detail[0]}"     # the compiler's first word
    lib.lp_dense_sigmoid_step.restype = ctypes.c_int
    lib.lp_dense_sigmoid_step.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long] + \
        [ctypes.c_void_p, ctypes.c_long] * 2 + [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + \
        [ctypes.c_void_p] * 2 + [ctypes.c_void_p, ctypes.c_long] * 3
    lib.lp_supported_width.argtypes = [ctypes.c_int]
    lib.lp_residual.restype = ctypes.c_double
    lib.lp_residual.argtypes = [ctypes.c_int, ctypes.c_long] + \
        [ctypes.c_void_p, ctypes.c_long] * 3 + [ctypes.c_int]
    if {w for w in range(1, 65) if lib.lp_supported_width(w)} != WIDTHS:
        return None, "kernel widths differ from kernel.WIDTHS"
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


def dense_sigmoid_step(u, K, b, h, scale: float, shift: float, save=None, out=None,
                       plus=None):
    """u + h·(scale·s + shift) [+ plus] with s = sigmoid(K u + b) (and s into `save`),
    or None when the kernel does not apply and the caller takes the torch path.

    u, out, save, plus: (w, B) or (m, w, B) with contiguous rows; K (…, w, w), b
    (…, w) or (…, 1); h: a float or an (m,) tensor.  (Called once per step: the
    checks read each tensor's metadata once.)
    """
    shape = u.shape
    nd = len(shape)
    if nd not in (2, 3) or shape[-2] not in WIDTHS or not _f64(u):
        return None                       # (before loading: GPU runs never compile it)
    lib = _state["lib"] if "lib" in _state else load()
    if lib is None:
        return None
    if (u.requires_grad or K.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        return None
    w, B = shape[-2], shape[-1]
    m = shape[0] if nd == 3 else 1
    if out is None:
        out = torch.empty(shape, dtype=torch.float64)
    su = u.stride()
    so = _rows(out, shape)
    ss = _rows(save, shape) if save is not None else su
    sg = _rows(plus, shape) if plus is not None else su
    if save is not None and plus is not None or sg is None or \
            su[-2:] != (B, 1) or so is None or ss is None or not _f64(K) or not _f64(b) or \
            K.dim() != nd or K.shape[-2:] != (w, w) or K.stride()[-2:] != (w, 1) or \
            b.dim() != nd - 1 or b.shape[-1] not in (1, w) or \
            (nd == 3 and (K.shape[0] != m or b.shape[0] != m)):
        return None
    L, lead = w * B, nd == 3
    pu, po = u.data_ptr(), out.data_ptr()
    ps = save.data_ptr() if save is not None else None
    pg = plus.data_ptr() if plus is not None else None
    if _meets(pu, su, po, so, m, L, lead) or ps is not None and \
            (_meets(ps, ss, po, so, m, L, lead) or _meets(ps, ss, pu, su, m, L, lead)) or \
            pg is not None and _meets(pg, sg, po, so, m, L, lead):
        return None
    if isinstance(h, torch.Tensor):
        hs = h.tolist()
        av = (ctypes.c_double * m)(*[x * scale for x in hs])
        cv = (ctypes.c_double * m)(*[x * shift for x in hs])
    else:
        av = (ctypes.c_double * m)(*([h * scale] * m))
        cv = (ctypes.c_double * m)(*([h * shift] * m))
    lib.lp_dense_sigmoid_step(
        m, w, B, pu, su[0] if lead else 0, K.data_ptr(), K.stride(0) if lead else 0,
        b.data_ptr(), b.stride(0) if lead else 0, 0 if b.shape[-1] == 1 else b.stride(-1),
        av, cv, pg, sg[0] if lead and pg is not None else 0, po, so[0] if lead else 0,
        ps, ss[0] if lead and ps is not None else 0)
    return out


def _f64(t) -> bool:
    return t.dtype is torch.float64 and t.is_cpu


def _rows(t, shape):
    """t's strides if it is a CPU float64 tensor of `shape` with contiguous rows."""
    if t.shape != shape or not _f64(t):
        return None
    st = t.stride()
    return st if st[-2:] == (shape[-1], 1) else None


def _meets(p, sp, q, sq, m: int, L: int, lead: bool) -> bool:
    """Whether some state of one stack shares memory with one of the other.

    (Pointers p, q; strides sp, sq; m states of L elements each, contiguous.)
    Stacks of every c-th state of one buffer interleave without sharing a
    state: with equal strides s ≥ L they meet iff their distance d is within
    L of a multiple k·s, |k| < m.  Otherwise: whether their address ranges do.
    """
    d = (q - p) // 8
    if not lead:
        return abs(d) < L
    s = sp[0]
    if s == sq[0] and s >= L:             # the two multiples of s nearest to d, in range
        near = (min(max(k, 1 - m), m - 1) for k in (d // s, d // s + 1))
        return any(abs(d - k * s) < L for k in near)
    span_p, span_q = (m - 1) * sp[0] + L, (m - 1) * sq[0] + L
    return d < span_p and -d < span_q


RESIDUAL_MODES = {"norm": 0, "in_place": 1, "add_to": 2}


def residual(phi, target, mode: str = "norm", out=None) -> float:
    """Σ‖phi − target‖² over the states, and by mode: nothing else ("norm"), phi ←
    phi − target ("in_place"), out += phi − target ("add_to", out like phi).

    One C pass for float64 CPU states that are contiguous blocks (stacked as
    (m, …) or one state), torch operations otherwise.
    """
    if mode == "add_to" and out is None:
        raise ValueError("residual(mode='add_to') needs `out`")
    sq = _residual_pass(phi, target, mode, out)
    if sq is not None:
        return sq
    r = phi.sub_(target) if mode == "in_place" else torch.sub(phi, target)
    if mode == "add_to":
        out += r
    flat = r.reshape(-1)
    return float(torch.dot(flat, flat))


def _residual_pass(phi, target, mode: str, out) -> float | None:
    """residual() in C, or None when the kernel does not apply."""
    if not _f64(phi) or not _f64(target) or phi.shape != target.shape:
        return None
    lib = _state["lib"] if "lib" in _state else load()
    if lib is None:
        return None
    one = phi.dim() < 3
    m = 1 if one else phi.shape[0]
    L = phi[0].numel() if not one else phi.numel()
    sp, st = _states(phi, one, L), _states(target, one, L)
    so = _states(out, one, L) if out is not None and out.shape == phi.shape and _f64(out) \
        else None
    if sp is None or st is None or (mode == "add_to" and so is None):
        return None
    return lib.lp_residual(m, L, phi.data_ptr(), sp, target.data_ptr(), st,
                           out.data_ptr() if so is not None else None, so or 0,
                           RESIDUAL_MODES[mode])


def _states(t, one: bool, L: int):
    """Elements between t's states if each is contiguous (0 for one state), else None."""
    if one:
        return 0 if t.is_contiguous() else None
    if not t[0].is_contiguous():
        return None
    st = t.stride()
    return st[0] if st[0] >= L or t.shape[0] == 1 else None
