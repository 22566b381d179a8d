"""Post-run report: plots and a summary table built from the metrics.h5 files of runs."""
