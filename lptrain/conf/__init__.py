"""lptrain's Hydra configuration (YAML), shipped with the package: `pkg://lptrain.conf`."""
