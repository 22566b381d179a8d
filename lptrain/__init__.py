"""lptrain: layer-parallel training of deep residual networks with MGRIT."""

__version__ = "0.1.0"
