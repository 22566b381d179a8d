"""MGRIT across the layers: pure hierarchy arithmetic, the solver, its message exchange."""
from lptrain.mgrit.options import MGRITOptions  # noqa: F401
from lptrain.mgrit.solver import MGRIT, CycleOptions, SolveResult  # noqa: F401
