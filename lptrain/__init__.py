"""lptrain: layer-parallel training of deep residual networks with MGRIT."""

import logging

__version__ = "0.1.0"

# lptrain logs through the "lptrain" logger (the console's lines, errors); the application
# decides where they go (the lptrain command: Hydra's job log in the run directory)
logging.getLogger("lptrain").addHandler(logging.NullHandler())

__all__ = ["BuiltinSteps", "CoarseStep", "LayerParallel", "LayerParallelResNet", "MGRITOptions",
           "load_model", "__version__"]


def __getattr__(name):
    # lazy, so that `import lptrain` stays light for the CLI and tools
    if name == "BuiltinSteps":
        from lptrain.parallel.builtin_steps import BuiltinSteps
        return BuiltinSteps
    if name == "CoarseStep":
        from lptrain.model.coarse_steps import CoarseStep
        return CoarseStep
    if name == "LayerParallel":
        from lptrain.parallel.lp_module import LayerParallel
        return LayerParallel
    if name == "LayerParallelResNet":
        from lptrain.parallel.module import LayerParallelResNet
        return LayerParallelResNet
    if name == "MGRITOptions":
        from lptrain.mgrit.options import MGRITOptions
        return MGRITOptions
    if name == "load_model":
        from lptrain.model.saved import load_model
        return load_model
    raise AttributeError(name)
