"""lptrain on one GPU: exactness against the CPU, step costs, and batched F-relaxation.

    python bench/gpu.py [--device cuda] [--parts check steps relax] [--reps 5]

Issue 22 item 4 (a, c) and issue 23 item 3 (cuda). bench/device.sh runs it on a lent
device machine; with --device cpu it runs here (a dry run of the script itself).

check   on the device, against the same computation on the CPU in float64:
        - LayerParallel with users' steps (tests/mpi/module_case.py's cases: dense, conv,
          conv–GroupNorm–conv, fixed-iteration and user-coarse variants, lptrain's own
          dense and conv step families), solved to 1e-13: output, input gradient and every
          parameter gradient against serial autograd on the CPU; under no_grad; float32
          against the float64 reference;
        - the serial, mgrit (converged) and simultaneous (2 + 2 iterations) objectives on
          the benchmark network: value and gradient on the device against the CPU.
steps   (a) seconds per optimizer step, serial and simultaneous (2 + 2 iterations,
        warm), alternating (bench/simultaneous_step.py's run_steps, synchronised): the
        benchmark network (N = 1024, width 8, batch 5000) in float32 and float64, and
        dataset=mnist's conv network at batch 500 in float64 and float32.
relax   (c) level 0's F-relaxation (c = 4) of all N/4 intervals as one batched step
        per F-point, the same in lptrain's chunks of stacked.CHUNK intervals, and the
        serial sweep of N steps, float32 and float64; and one MGRIT forward iteration.
chunk   the lever (c) points at, for an A/B where a GPU is lent: the one-shot step
        (2 + 2) and a one-iteration forward value with stacked.CHUNK = 8 (lptrain's, for
        CPU caches) against all intervals in one chunk, alternating, float32 and
        float64, with the largest gradient difference between the two.

Prints one line per result and writes bench/results/gpu_<device>.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

from common import data, network, save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "mpi"))
import module_case as mc  # noqa: E402

from lptrain.mgrit import stacked  # noqa: E402
from lptrain.mgrit.options import MGRITOptions  # noqa: E402
from lptrain.parallel.context import SerialExchange  # noqa: E402
from lptrain.parallel.lp_module import LayerParallel  # noqa: E402
from lptrain.parallel.propagators import ForwardPropagator  # noqa: E402
from lptrain.train.objective import Objective  # noqa: E402
from lptrain.train.mgrit_oracle import MGRITOracle  # noqa: E402
from lptrain.train.oneshot import SimultaneousOracle  # noqa: E402
from lptrain.train.oracles import Batch, SerialOracle  # noqa: E402

DEV = "cpu"


def sync():
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


def maxdiff(a: dict, b: dict) -> float:
    return max(float((a[k].cpu().double() - b[k].cpu().double()).abs().max()) for k in a)


# ---- check: LayerParallel with users' steps --------------------------------------------

def module_case(name, dtype, device) -> dict:
    """One module case solved by MGRIT on `device`: output, ∂u0 and every ∂θ."""
    make, shape, opts, stack = mc.CASES[name]
    mod = LayerParallel(make, T=1.0, n_layers=mc.N, stack=stack,
                        mgrit=MGRITOptions(**{**mc.TOL, **opts}),
                        coarse_steps=mc.COARSE.get(name)).to(device=device, dtype=dtype)
    return _solved(mod, shape, dtype, device)


def builtin_case(name, dtype, device) -> dict:
    _, _, _, shape, opts = mc.BUILTIN[name]
    mod = LayerParallel(mc.builtin(name), T=1.0,
                        mgrit=MGRITOptions(**{**mc.TOL, **opts})).to(device=device, dtype=dtype)
    return _solved(mod, shape, dtype, device)


def _solved(mod, shape, dtype, device, serial: bool = False) -> dict:
    """Output, input gradient and every parameter gradient of module_case's loss, by
    MGRIT (and its output under no_grad) or, with `serial`, by serial autograd."""
    u0 = mc._input(shape, 1).to(device=device, dtype=dtype).requires_grad_()
    out = mod.serial(u0) if serial else mod(u0)
    mc.loss_of(out, 2).backward()
    res = {"out": out.detach(), "gu": u0.grad.detach()}
    for n in mod.owned:
        for k, p in mod.steps.module(n).named_parameters():
            res[f"{n}.{k}"] = p.grad.detach()
    with torch.no_grad():
        res["nograd"] = out.detach() if serial else mod(u0.detach())
    return res


def reference(name) -> dict:
    """Serial autograd on the CPU in float64 (module_case.reference's computation)."""
    if name in mc.CASES:
        make, shape, _, _ = mc.CASES[name]
        mod = LayerParallel(make, T=1.0, n_layers=mc.N)
    else:
        shape = mc.BUILTIN[name][3]
        mod = LayerParallel(mc.builtin(name), T=1.0)
    return _solved(mod, shape, torch.float64, "cpu", serial=True)


def check_modules(rows: list) -> None:
    for name in [*mc.CASES, *mc.BUILTIN]:
        ref = reference(name)
        case = module_case if name in mc.CASES else builtin_case
        for dtype in (torch.float64, torch.float32):
            if name == "exact" and (DEV != "cpu" or dtype != torch.float64):
                continue    # its coarse steps hold float64 CPU copies outside the tree
            t0 = time.perf_counter()
            got = case(name, dtype, DEV)
            sync()
            scale = max(float(v.abs().max()) for v in ref.values())
            d = maxdiff(got, ref)
            row = {"part": "check", "what": f"LayerParallel {name}", "dtype": str(dtype)[6:],
                   "device": DEV, "max_abs_diff": d, "max_abs_value": scale,
                   "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"check LayerParallel {name:7s} {row['dtype']}: max |Δ| {d:.2e} "
                  f"(values up to {scale:.2f}) {row['seconds']:.2f} s", flush=True)


# ---- check: lptrain's objectives -------------------------------------------------------

def oracles(net):
    mg = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1, tol=1e-11,
                      max_iter=60)
    sim = dataclasses.replace(mg, fwd_iters=2, adj_iters=2, control="fixed")
    return {"serial": Objective(SerialOracle(net, SerialExchange()), net),
            "mgrit": Objective(MGRITOracle(net, SerialExchange(), mg), net),
            "simultaneous": Objective(SimultaneousOracle(net, SerialExchange(), sim), net)}


def evaluate(net, theta, x, y) -> dict:
    out = {}
    for name, o in oracles(net).items():
        o.begin(Batch(x, y))
        ev = o.value(theta)
        out[name] = (float(ev.point.objective), o.gradient(ev).detach().cpu())
    return out


def check_oracles(rows: list) -> None:
    net, theta = network(64)
    x, y = data(500)
    cpu = evaluate(net, theta, x, y)
    on = evaluate(net, theta.to(DEV), x.to(DEV), y.to(DEV))
    for name in cpu:
        dj = abs(on[name][0] - cpu[name][0])
        dg = float((on[name][1] - cpu[name][1]).abs().max() / cpu[name][1].abs().max())
        rows.append({"part": "check", "what": f"objective {name}", "dtype": "float64",
                     "device": DEV, "abs_diff_J": dj, "rel_diff_grad": dg,
                     "J": cpu[name][0]})
        print(f"check objective {name:12s} float64 N=64: J {cpu[name][0]:.6f}, |ΔJ| "
              f"{dj:.1e}, max |Δ∇| / max |∇| {dg:.1e}", flush=True)


# ---- steps (a) ----------------------------------------------------------------------------

def step_costs(rows: list, reps: int) -> None:
    import simultaneous_step as ss
    for dtype in (torch.float32, torch.float64):
        net, theta = network(1024, dtype=dtype)
        x, y = data(5000, dtype=dtype)
        mg = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1,
                          fwd_iters=2, adj_iters=2, control="fixed")
        _compare(rows, "benchmark N=1024 batch 5000", net, theta.to(DEV), x.to(DEV),
                 y.to(DEV), mg, ss, reps)
    from lptrain.app import build
    from lptrain.config import compose
    for dtype in ("float64", "float32"):
        opts, _ = compose(["mode=simultaneous", "dataset=mnist", f"dtype={dtype}"])
        _, d, net, theta, _, _ = build(opts, None)
        mg = dataclasses.replace(opts.mgrit, control="fixed", calibrate_every=0)
        _compare(rows, f"mnist conv N={net.opts.layers} batch 500", net, theta.to(DEV),
                 d.x_train[:500].to(DEV, theta.dtype), d.y_train[:500].to(DEV), mg, ss, reps)


def _compare(rows, what, net, theta, x, y, mg, ss, reps):
    sim = SimultaneousOracle(net, SerialExchange(), mg)
    synced = [_Synced(Objective(SerialOracle(net, SerialExchange()), net)),
              _Synced(Objective(sim, net))]
    serial, simul = ss.run_steps(synced, theta, x, y, reps)
    row = {"part": "steps", "what": what, "dtype": str(theta.dtype)[6:], "device": DEV,
           "fwd_iters": mg.fwd_iters, "adj_iters": mg.adj_iters, "serial_s": serial,
           "simultaneous_s": simul, "ratio": simul / serial}
    rows.append(row)
    print(f"steps {what} {row['dtype']} on {DEV}: serial {serial * 1e3:.1f} ms, "
          f"simultaneous ({mg.fwd_iters}+{mg.adj_iters}) {simul * 1e3:.1f} ms, ratio "
          f"{row['ratio']:.2f}", flush=True)


class _Synced:
    """An objective whose value and gradient wait for the device (honest wall time)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def value(self, theta):
        ev = self.inner.value(theta)
        sync()
        return ev

    def gradient(self, ev):
        g = self.inner.gradient(ev)
        sync()
        return g


# ---- relax (c) ----------------------------------------------------------------------------

def timed(fn, reps: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def relax(rows: list, reps: int, layers: int = 1024, batch: int = 5000, cf: int = 4) -> None:
    for dtype in (torch.float32, torch.float64):
        net, theta = network(layers, dtype=dtype)
        theta = theta.to(DEV)
        x, _ = data(batch, dtype=dtype)
        prop = ForwardPropagator(net.stepper(theta), net.h)
        u0 = torch.randn(8, batch, dtype=dtype, device=DEV)       # states: width × batch
        U = torch.randn(layers // cf, 8, batch, dtype=dtype, device=DEV)
        cs = list(range(0, layers, cf))

        def sweep():
            u = u0
            for n in range(layers):
                u = prop.step(u, n, n + 1)

        def batched(chunk):
            def run():
                for first in range(0, len(cs), chunk):
                    V = U[first:first + chunk]
                    for sub in range(cf - 1):
                        idx = [c + sub for c in cs[first:first + chunk]]
                        V = prop.step_many(V, idx, [i + 1 for i in idx])
            return run
        t = {"serial sweep": timed(sweep, reps),
             "F-relaxation, all intervals batched": timed(batched(len(cs)), reps),
             f"F-relaxation, chunks of {stacked.CHUNK}": timed(batched(stacked.CHUNK), reps)}
        t["one-shot forward value (1 MGRIT iteration, warm)"] = forward_iteration(net, theta, x.to(DEV), reps)
        for k, v in t.items():
            rows.append({"part": "relax", "what": k, "dtype": str(dtype)[6:], "device": DEV,
                         "layers": layers, "batch": batch, "seconds": v,
                         "serial_over_this": t["serial sweep"] / v})
            print(f"relax N={layers} batch {batch} {str(dtype)[6:]} on {DEV}: {k:38s} "
                  f"{v * 1e3:8.2f} ms (serial sweep / this {t['serial sweep'] / v:.2f})",
                  flush=True)


def forward_iteration(net, theta, x, reps) -> float:
    """Seconds of one iteration of lptrain's forward MGRIT solve (3 levels, c = 4)."""
    mg = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1, tol=0.0,
                      max_iter=1, fwd_iters=1, adj_iters=1, control="fixed")
    sim = SimultaneousOracle(net, SerialExchange(), mg)
    y = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)

    def once():
        sim.begin(Batch(x, y))
        sim.value(theta)
    return timed(once, reps)


class _Chunked(_Synced):
    """A synchronised objective that runs its solves with stacked.CHUNK = `chunk`."""

    def __init__(self, inner, chunk: int):
        super().__init__(inner)
        self.chunk = chunk

    def value(self, theta):
        stacked.CHUNK = self.chunk
        return super().value(theta)

    def gradient(self, ev):
        stacked.CHUNK = self.chunk
        return super().gradient(ev)


def chunks(rows: list, reps: int, layers: int = 1024, batch: int = 5000) -> None:
    import simultaneous_step as ss
    default = stacked.CHUNK
    try:
        for dtype in (torch.float32, torch.float64):
            net, theta = network(layers, dtype=dtype)
            x, y = data(batch, dtype=dtype)
            theta, x, y = theta.to(DEV), x.to(DEV), y.to(DEV)
            mg = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1,
                              fwd_iters=2, adj_iters=2, control="fixed")
            sides = {c: _Chunked(Objective(SimultaneousOracle(net, SerialExchange(), mg),
                                           net), c) for c in (default, layers)}
            grads = []
            for side in sides.values():
                side.begin(Batch(x, y))
                grads.append(side.gradient(side.value(theta)).double().cpu())
            times = ss.run_steps(list(sides.values()), theta, x, y, reps)
            fwd = {}
            for c in sides:
                stacked.CHUNK = c
                fwd[c] = forward_iteration(net, theta, x, reps)
            row = {"part": "chunk", "dtype": str(dtype)[6:], "device": DEV, "layers": layers,
                   "batch": batch, "chunk": list(sides), "step_s": times,
                   "forward_value_s": list(fwd.values()),
                   "max_grad_diff": float((grads[0] - grads[1]).abs().max())}
            rows.append(row)
            print(f"chunk N={layers} {row['dtype']} on {DEV}: one-shot step "
                  f"{times[0] * 1e3:.1f} ms (chunks of {default}) vs {times[1] * 1e3:.1f} ms "
                  f"(one chunk); forward value {row['forward_value_s'][0] * 1e3:.1f} vs "
                  f"{row['forward_value_s'][1] * 1e3:.1f} ms; max |Δ∇| "
                  f"{row['max_grad_diff']:.1e}", flush=True)
    finally:
        stacked.CHUNK = default


PARTS = {"check": lambda rows, a: (check_modules(rows), check_oracles(rows)),
         "steps": lambda rows, a: step_costs(rows, a.reps),
         "relax": lambda rows, a: relax(rows, a.reps),
         "chunk": lambda rows, a: chunks(rows, a.reps)}


def main():
    global DEV
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    DEV = a.device
    if DEV.startswith("cuda"):
        print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    for part in a.parts:
        try:
            PARTS[part](rows, a)
        except Exception as e:          # the other parts still run; the error is a result
            rows.append({"part": part, "error": f"{type(e).__name__}: {e}"})
            print(f"{part}: FAILED {type(e).__name__}: {e}", flush=True)
            import traceback
            traceback.print_exc()
        finally:
            save(f"gpu_{DEV.split(':')[0]}", {"rows": rows})


if __name__ == "__main__":
    main()
