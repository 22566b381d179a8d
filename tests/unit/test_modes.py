"""Every mode has one name (lptrain/modes.py), a YAML config and registered data terms."""
import pytest

from helpers import dense_net
from lptrain import config
from lptrain.config.schema import ModeOptions
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.modes import LAYERED, MODES
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oracles import SerialOracle
from lptrain.train.terms import TERMS, make_oracle

pytestmark = pytest.mark.unit


def test_every_mode_name_has_a_config_and_data_terms():
    assert set(MODES) == set(config.yaml_choices("mode")) == set(TERMS)
    assert set(LAYERED) < set(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_the_layered_modes_are_the_mgrit_ones(mode):
    net, _ = dense_net()
    terms = make_oracle(ModeOptions(name=mode), net, SerialExchange(), MGRITOptions())
    assert isinstance(terms, MGRITOracle) == (mode in LAYERED)
    assert isinstance(terms, SerialOracle) == (mode not in LAYERED)
