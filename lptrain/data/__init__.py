"""Datasets: each module registers its loader in lptrain.data.base.LOADERS."""
from lptrain.data import indian_pines  # noqa: F401
from lptrain.data import mnist  # noqa: F401
from lptrain.data import peaks  # noqa: F401
from lptrain.data.base import LOADERS, Dataset, load_dataset  # noqa: F401
