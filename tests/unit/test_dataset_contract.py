"""docs/architecture.md's example of a new dataset runs as written: load_dataset calls its
loader with the recorded preprocessing, its sizes are known before loading, and the
config schema finds its options."""
import re
from pathlib import Path

import pytest
import torch

from lptrain.config.schema import dataset_options
from lptrain.data import base

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


@pytest.fixture
def blobs():
    """The namespace of the docs' dataset example, registered for this test only."""
    section = ARCHITECTURE.read_text().split("## Where to add")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "docs/architecture.md 'Where to add': no dataset example"
    namespace = {}
    try:
        exec(compile(re.sub(r"(?m)^  ", "", blocks[0]), str(ARCHITECTURE), "exec"),
             namespace)
        yield namespace
    finally:
        base.LOADERS.pop("blobs", None)
        base.SIZES.pop("blobs", None)


def test_the_documented_dataset_loads_with_a_recorded_preprocessing(blobs):
    """The docs described a loader(options, seed) that load_dataset, which passes a
    third argument (a saved model's preprocessing), failed to call with a TypeError."""
    options = blobs["BlobsOptions"]()
    data = base.load_dataset(options, 3)
    assert (data.x_train.shape, data.x_val.shape) == ((90, 2), (30, 2))
    sizes = base.dataset_sizes(options)
    assert (sizes.n_train, sizes.n_val, sizes.feature_shape) == (90, 30, data.feature_shape)
    spec = data.meta["preprocessing"]
    assert torch.equal(base.load_dataset(options, 3, spec).x_val, data.x_val)
    other = blobs["BlobsOptions"](n_train=30)        # other statistics, the recorded ones win
    x_val = base.load_dataset(other, 3, spec).x_val
    assert not torch.equal(x_val, base.load_dataset(other, 3).x_val)
    assert base.load_dataset(other, 3, spec).meta["preprocessing"] == spec
    assert dataset_options()["blobs"] is blobs["BlobsOptions"]
