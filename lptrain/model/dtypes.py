"""The floating-point types a run computes in, by their config names (`dtype`)."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}
