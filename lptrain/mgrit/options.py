"""MGRIT options (the Hydra group `mgrit`), validated once on construction."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from lptrain.errors import ConfigError, one_of, require
from lptrain.mgrit.solver import CYCLES, LEVEL_OPS, CycleOptions, fixed_solve

COARSE_WEIGHTS = ("inject", "average")
# Upper bounds, so that a typo cannot start a solve that never ends (a stop signal is acted
# on between optimizer iterations only). A few CF sweeps are all a relaxation uses (FCF:
# 1); MGRIT solves to rounding in tens of cycles, and at most in one per C-point.
MAX_RELAX = 32      # mgrit.nrelax0, mgrit.nrelax
MAX_CYCLES = 1000   # iterations per solve: max_iter, adj_max_iter, fwd_iters, adj_iters,
                    # control_max_iters, adaptive_max_extra
CONTROLS = ("fixed", "error")    # the one-shot controller (train/control.py ControlOptions)


@dataclass
class MGRITOptions:
    levels: int = 3              # maximum number of levels (1 = serial stepping)
    cfactor0: int = 4            # coarsening factor on the finest level
    cfactor: int = 4             # coarsening factor on coarser levels
    min_coarse: int = 2          # a coarse level keeps at least this many steps
    nrelax0: int = 0             # CF sweeps after the first F-relaxation, finest level
    nrelax: int = 1              # the same on coarser levels (1 = FCF)
    skip_first_down: bool = True  # cold starts: first cycle = coarse propagation of u_0
    warm_down: bool = True       # warm starts: the first cycle relaxes the coarse levels
    cycle: str = "V"             # V | F
    tol: float = 1e-10           # absolute residual tolerance (forward)
    rtol: float = 0.0            # tolerance relative to the first residual (0 = off)
    max_iter: int = 50           # forward iterations per solve (mode=mgrit)
    coarse_weights: str = "average"  # average | inject (coarse step: layer mean or first)
    adj_tol: Optional[float] = None     # adjoint tolerance (None = tol)
    adj_max_iter: Optional[int] = None  # adjoint iterations (None = max_iter)
    fwd_iters: int = 2           # mode=simultaneous: forward iterations per optimizer step
    adj_iters: int = 2           # mode=simultaneous: adjoint iterations per optimizer step
    control: str = "error"       # simultaneous: error (plan iterations to grad_tol) | fixed
    grad_tol: float = 0.005      # ... target of the estimated relative gradient error
    control_min_iters: int = 1   # ... fewest iterations it plans per solve
    control_max_iters: int = 6   # ... most iterations it plans per solve
    calibrate_every: int = 0     # ... evaluations between exact-gradient calibrations (0 = off)
    adaptive: bool = False       # simultaneous: add iterations when residuals are large
    adaptive_ratio: float = 0.1  # ... i.e. when residual > ratio × gradient norm
    adaptive_max_extra: int = 4  # ... at most this many extra iterations per solve
    level_ops: str = "fused"     # fused | plain (the reference: same iterates, slower)

    def __post_init__(self):
        for key in ("levels", "max_iter", "fwd_iters", "adj_iters", "control_min_iters"):
            require(getattr(self, key) >= 1, f"mgrit.{key}", getattr(self, key), "must be >= 1")
        for key in ("cfactor0", "cfactor"):
            require(getattr(self, key) >= 2, f"mgrit.{key}", getattr(self, key), "must be >= 2")
        for key in ("min_coarse", "nrelax0", "nrelax", "adaptive_max_extra",
                    "calibrate_every"):
            require(getattr(self, key) >= 0, f"mgrit.{key}", getattr(self, key), "must be >= 0")
        self._bounded()
        require(self.cycle in CYCLES, "mgrit.cycle", self.cycle, one_of(CYCLES))
        require(self.coarse_weights in COARSE_WEIGHTS, "mgrit.coarse_weights",
                self.coarse_weights, one_of(COARSE_WEIGHTS))
        require(self.control in CONTROLS, "mgrit.control", self.control,
                one_of(CONTROLS))
        require(0 < self.grad_tol < math.inf, "mgrit.grad_tol", self.grad_tol,
                "must be a positive number")
        if self.control_max_iters < self.control_min_iters:   # either may be the one typed
            raise ConfigError(f"mgrit.control_min_iters={self.control_min_iters} and "
                              f"mgrit.control_max_iters={self.control_max_iters}: the "
                              f"fewest iterations planned exceed the most")
        require(self.level_ops in LEVEL_OPS, "mgrit.level_ops", self.level_ops,
                one_of(LEVEL_OPS))
        require(self.tol >= 0, "mgrit.tol", self.tol, "must be >= 0")
        require(0 <= self.rtol < 1, "mgrit.rtol", self.rtol, "must be in [0, 1)")
        require(self.adj_tol is None or self.adj_tol >= 0, "mgrit.adj_tol", self.adj_tol,
                "must be >= 0")
        require(self.adj_max_iter is None or self.adj_max_iter >= 1, "mgrit.adj_max_iter",
                self.adj_max_iter, "must be >= 1")
        require(self.adaptive_ratio > 0, "mgrit.adaptive_ratio", self.adaptive_ratio,
                "must be > 0")

    def _bounded(self) -> None:
        """The counts within MAX_RELAX and MAX_CYCLES (ConfigError naming the key)."""
        for key in ("nrelax0", "nrelax"):
            require(getattr(self, key) <= MAX_RELAX, f"mgrit.{key}", getattr(self, key),
                    f"must be at most {MAX_RELAX} (CF sweeps per relaxation)")
        for key in ("max_iter", "adj_max_iter", "fwd_iters", "adj_iters",
                    "control_max_iters", "adaptive_max_extra"):
            n = getattr(self, key)
            require(n is None or n <= MAX_CYCLES, f"mgrit.{key}", n,
                    f"must be at most {MAX_CYCLES} (iterations per solve)")

    def cycle_options(self, linear: bool = False):
        """The solver's CycleOptions for these options (linear: the adjoint's solver)."""
        return CycleOptions(nrelax0=self.nrelax0, nrelax=self.nrelax, cycle=self.cycle,
                            skip_first_down=self.skip_first_down, linear=linear,
                            level_ops=self.level_ops, warm_down=self.warm_down)

    def hierarchy(self, n_steps: int, size: int):
        """The MGRIT hierarchy of n_steps layers distributed over `size` ranks."""
        from lptrain.mgrit.hierarchy import build_hierarchy
        return build_hierarchy(n_steps, self.cfactor0, self.cfactor, self.levels,
                               self.min_coarse, size)

    @property
    def adjoint_tol(self) -> float:
        return self.tol if self.adj_tol is None else self.adj_tol

    @property
    def adjoint_max_iter(self) -> int:
        return self.max_iter if self.adj_max_iter is None else self.adj_max_iter

    @property
    def fixed_solves(self) -> tuple[bool, bool]:
        """Whether the forward and the adjoint solve have no tolerance (fixed_solve)."""
        return fixed_solve(self.tol, self.rtol), fixed_solve(self.adjoint_tol, self.rtol)
