"""The training modes by name: the `mode` config group's choices, the metrics file's `mode`
attribute, the memory estimate's and the grid choice's cases (train/terms.py builds each
mode's oracle)."""
from __future__ import annotations

SERIAL = "serial"               # exact layer-serial sweeps, the batch split over ranks
MGRIT = "mgrit"                 # forward and adjoint MGRIT to tolerance: exact gradients
SIMULTANEOUS = "simultaneous"   # one-shot: a few MGRIT iterations per optimizer iteration
MODES = (SERIAL, MGRIT, SIMULTANEOUS)
LAYERED = (MGRIT, SIMULTANEOUS)     # the modes that distribute the layers over ranks
