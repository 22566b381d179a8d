"""The configuration: typed schema (schema.py) and where the YAML defaults live."""
from pathlib import Path

# the Hydra config directory inside the installed package (lptrain/conf/)
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
CONF_MODULE = "lptrain.conf"      # the same, as Hydra's package path pkg://lptrain.conf
