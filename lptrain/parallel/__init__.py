"""Parallel glue: communicator context, propagators, LayerParallel, the torch module."""
from lptrain.parallel.layer_parallel import LayerParallel  # noqa: F401
