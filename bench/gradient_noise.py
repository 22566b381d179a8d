"""One row of the quality matrix on one configuration, optionally with a random gradient
error: how sensitive is a configuration's L-BFGS path to gradient errors of the size
one-shot training makes?

    .venv/bin/python bench/gradient_noise.py MODE [--eps E] [--noise-seed S] [KEY=VALUE ...]

Trains like bench/simultaneous_quality.py (same overrides, the final parameters evaluated
exactly, simultaneous runs 1.2 × longer for the "to serial J" column).  With --eps (serial
only) every gradient g becomes g + E·‖g‖·z/‖z‖, z Gaussian from a generator seeded S.
Prints the exact objective, the final and the last-fifth validation accuracy, and the
iterations the trajectory needs to reach a given objective (--target).
"""
from __future__ import annotations

import argparse

import simultaneous_quality as q


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serial", "simultaneous"])
    p.add_argument("--eps", type=float, default=0.0)
    p.add_argument("--noise-seed", type=int, default=0)
    p.add_argument("--target", type=float, help="objective to reach (e.g. serial's final)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    if a.eps > 0 and a.mode != "serial":
        p.error(f"--eps={a.eps}: gradient noise is for serial runs")
    r = q.run(a.mode, a.overrides, 1.2 if a.mode == "simultaneous" else 1.0,
              noise=(a.eps, a.noise_seed) if a.eps > 0 else None)
    reach = next((k + 1 for k, v in enumerate(r["trajectory"]) if a.target is not None
                  and v <= a.target), None)
    print(f"{a.mode} eps={a.eps} J={r['objective']:.6g} val={r['val']:.3f} "
          f"val_last_fifth={r['val_window']:.4f} accepted={r['accepted']:.2f} "
          f"grad_error={r['grad_error']:.2e} reaches_target_at={reach}")


if __name__ == "__main__":
    main()
