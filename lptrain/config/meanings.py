"""One line of meaning for every config group, choice and key (lptrain --help, docs).

The schema (schema.py and the options dataclasses it names) says which keys exist and
their types, the YAML configs their defaults; this table says what each one is for.
tests/unit/test_reference.py fails when a group, choice or key has no line here, or a
line here names one that no longer exists. VALUES gives what a text key accepts from the
constants the code checks it against.
"""
from __future__ import annotations

from lptrain.config.schema import DEVICES, DTYPES, MODES, OPTIMIZER_OPTIONS
from lptrain.data import LOADERS
from lptrain.data.indian_pines import VARIANTS
from lptrain.data.mnist import SCALINGS
from lptrain.metrics.tensorboard import LOGGERS
from lptrain.mgrit.options import MAX_CYCLES, MAX_RELAX
from lptrain.mgrit.options import COARSE_WEIGHTS, CONTROLS, CYCLES, LEVEL_OPS
from lptrain.model.activations import ACTIVATIONS
from lptrain.model.network import KINDS, OPENINGS
from lptrain.train.schedules import SCHEDULES

GROUPS = {
    "dataset": "the data to train on; each dataset also chooses its network and recipe",
    "network": "the ODE-ResNet: its kind of step, size, initialisation and regularisation",
    "optimizer": "how the parameters are updated",
    "recipe": "the training settings (train.*, dtype, optimizer, mgrit) a dataset brings",
    "mode": "how the gradient is computed",
    "mgrit": "the settings of the MGRIT solves (mode=mgrit and mode=simultaneous)",
    "experiment": "a named setup over all the others (the paper's, and deep variants)",
}

CHOICES = {
    "dataset": {
        "peaks": "2 features, 5 classes of MATLAB's peaks surface; generated, no files",
        "indian_pines": "hyperspectral pixels, 200 or 220 bands, 16 classes (docs/datasets.md)",
        "mnist": "28×28 handwritten digits, 10 classes",
        "fashion_mnist": "28×28 images of clothing, 10 classes",
    },
    "network": {
        "dense": "dense steps of width 8",
        "dense_wide": "dense steps of width 220 at T = 20 (the authors' Indian Pines net)",
        "conv": "3×3 convolutions, 4 channels, T = 5 (the authors' MNIST network)",
        "conv_pooled": "conv with 8 channels, a conv opening, a classifier on 4×4 averages",
        "custom": "your own residual step: the torch module network.step._target_ names",
    },
    "optimizer": {
        "lbfgs": "full-batch L-BFGS with Armijo backtracking",
        "lbfgs_m20": "L-BFGS with memory 20 (the authors' Indian Pines and MNIST setting)",
        "lbfgs_paper": "the authors' L-BFGS: memory 10, stops at gradient norm 1e-4",
        "sgd": "SGD with momentum (torch.optim)",
        "adam": "Adam (torch.optim)",
        "adam_cosine": "Adam whose rate falls from lr to lr_min along a half cosine",
    },
    "recipe": {
        "default": "full-batch L-BFGS, 300 iterations, float64 (Peaks, Indian Pines)",
        "mnist": "Adam with a cosine schedule, batches of 100, float32, 480 iterations",
        "fashion_mnist": "the mnist recipe for 1200 iterations (2 epochs), validated "
                         "every 200, one kept warm batch, 2 MGRIT levels of c = 2",
    },
    "mode": {
        "serial": "exact gradients from serial forward and backward sweeps",
        "mgrit": "the same gradients, forward and adjoint solved by MGRIT to mgrit.tol",
        "simultaneous": "one-shot: a few warm-started MGRIT iterations per optimizer step",
    },
    "mgrit": {
        "default": "lptrain's MGRIT settings",
        "paper": "the authors' released Peaks MGRIT settings",
    },
    "experiment": {
        "peaks_paper": "the authors' Peaks setup (docs/method.md §7)",
        "peaks_deep": "Peaks on N = 1024 layers, for scaling studies",
        "indian_pines_paper": "the authors' Indian Pines setup",
        "indian_pines_deep": "indian_pines_paper on N = 256 layers",
        "mnist_paper": "the authors' MNIST setup",
        "mnist_deep": "mnist_paper on N = 256 layers",
    },
}

KEYS = {
    "eval_every": "iterations between validations (also before the first, after the last)",
    "checkpoint_every": "iterations between checkpoints; null: automatic (< 2 % of the "
                        "time); 0: only at the end or when stopped",
    "seed": "seed of the data sampling and split, the initial weights and the batches",
    "dtype": "floating-point precision of data, states and parameters",
    "device": "where the tensors live; cuda puts rank r of a node on cuda:r",
    "logger": "tensorboard also writes the scalars as TensorBoard events",
    "train.iterations": "optimizer iterations",
    "train.batch_size": "samples per mini-batch; null: the full batch (L-BFGS needs it)",
    "train.patience": "stalled after this many iterations without a better objective "
                      "(mini-batches: rounded up to whole epochs, at least two); 0: never",
    "train.fail_on_stall": "a stalled run exits 1 instead of 0",
    "parallel.layer_ranks": "ranks per layer group, which runs MGRIT over the layers; auto: "
                            "the speedup model's choice",
    "parallel.data_ranks": "layer groups, each on its shard of every batch; null: P / "
                           "layer_ranks",
    "mode.name": "how the gradient is computed; set by the mode choice",
    "mode.warm_batches": "simultaneous with mini-batches: batches whose states are kept as "
                         "warm starts",
    "network.name": "the kind of step; set by the network choice",
    "network.width": "dense (and custom on feature vectors): width of the state (conv: "
                     "unused, see channels)",
    "network.channels": "conv (and custom on images): channels of the state",
    "network.layers": "N, the number of residual steps",
    "network.T": "final time; a step is h = T / N long",
    "network.activation": "activation of every step (custom: of the opening only)",
    "network.bias": "one bias per layer (scalar, the authors') or one per unit (vector); "
                    "custom: unused",
    "network.opening": "the layer from inputs to the first state",
    "network.pool": "conv: the classifier sees pool×pool averages of the final state; "
                    "1: all of it",
    "network.init": "initial weights: uniform U[0,1)·scale (the authors') or normal "
                    "N(0,1)·scale",
    "network.init_opening": "scale of the opening layer's initial weights",
    "network.init_hidden": "scale of the steps' initial weights (custom: unused, the "
                           "module's constructor draws them, seeded by seed)",
    "network.init_classifier": "scale of the classifier's initial weights",
    "network.gamma_tik": "Tikhonov regularisation of the step weights (docs/method.md §1)",
    "network.gamma_class": "Tikhonov regularisation of the classifier weights",
    "network.gamma_ddt": "regularisation of the weights' change from layer to layer",
    "network.step": "custom: _target_ (the step's class, package.module.Class) and its "
                    "keyword arguments; add them with +network.step.NAME=VALUE",
    "mgrit.levels": "most MGRIT levels (1: serial stepping)",
    "mgrit.cfactor0": "coarsening factor of the finest level",
    "mgrit.cfactor": "coarsening factor of the coarser levels",
    "mgrit.min_coarse": "a coarse level keeps at least this many steps",
    "mgrit.nrelax0": f"CF sweeps after the first F-relaxation on the finest level (0 to "
                     f"{MAX_RELAX})",
    "mgrit.nrelax": f"CF sweeps after the first F-relaxation on coarser levels (1: FCF; "
                     f"0 to {MAX_RELAX})",
    "mgrit.skip_first_down": "a cold start's first cycle is a coarse propagation of u_0",
    "mgrit.warm_down": "a warm start's first cycle relaxes the coarse levels before restricting",
    "mgrit.cycle": "the multigrid cycle",
    "mgrit.tol": "absolute residual tolerance of a forward solve",
    "mgrit.rtol": "residual tolerance relative to the first residual; 0: off",
    "mgrit.max_iter": f"most forward iterations per solve (mode=mgrit; 1 to "
                       f"{MAX_CYCLES})",
    "mgrit.coarse_weights": "a coarse step's weights: the mean over its layers (average) or "
                            "its first layer's (inject)",
    "mgrit.adj_tol": "residual tolerance of an adjoint solve; null: mgrit.tol",
    "mgrit.adj_max_iter": f"most adjoint iterations per solve (1 to {MAX_CYCLES}); null: "
                          f"mgrit.max_iter",
    "mgrit.fwd_iters": f"simultaneous: forward iterations per step (the first plan; 1 "
                       f"to {MAX_CYCLES})",
    "mgrit.adj_iters": f"simultaneous: adjoint iterations per step (the first plan; 1 "
                       f"to {MAX_CYCLES})",
    "mgrit.control": "simultaneous: plan the iterations to keep the gradient error below "
                     "grad_tol (error), or keep them (fixed)",
    "mgrit.grad_tol": "simultaneous: target of the estimated relative gradient error",
    "mgrit.control_min_iters": "simultaneous: fewest iterations planned per solve",
    "mgrit.control_max_iters": f"simultaneous: most iterations planned per solve (at most "
                                f"{MAX_CYCLES})",
    "mgrit.calibrate_every": "simultaneous: evaluations between calibrations of the error "
                             "estimate against an exact gradient; 0: never",
    "mgrit.adaptive": "simultaneous: add iterations where residuals are large",
    "mgrit.adaptive_ratio": "... large: above this ratio times the gradient norm",
    "mgrit.adaptive_max_extra": f"... at most this many extra iterations per solve (0 to "
                                 f"{MAX_CYCLES})",
    "mgrit.level_ops": "the solver's level operations: fused, or plain (the slower "
                       "reference, the same iterates)",
    "optimizer.name": "the optimizer; set by the optimizer choice",
    "optimizer.memory": "stored (s, y) pairs",
    "optimizer.c1": "Armijo constant of the line search",
    "optimizer.step0": "first trial step of each line search",
    "optimizer.backtrack": "step factor after a failed trial",
    "optimizer.max_ls": "most line-search trials per iteration",
    "optimizer.gtol": "stop when the gradient norm falls below this",
    "optimizer.lr": "learning rate (where a schedule starts)",
    "optimizer.schedule": "the learning rate over train.iterations",
    "optimizer.lr_min": "the rate a cosine or linear schedule falls to, reached after the "
                        "last iteration (as torch's schedulers)",
    "optimizer.momentum": "momentum",
    "optimizer.nesterov": "Nesterov's momentum instead",
    "optimizer.beta1": "decay of the gradient average",
    "optimizer.beta2": "decay of the squared-gradient average",
    "optimizer.eps": "added to the denominator",
    "dataset.name": "the dataset; set by the dataset choice",
    "dataset.n_train": "training samples: a seeded stratified subset (peaks: k/5 points "
                       "of each class, drawn with replacement; null, image datasets: all)",
    "dataset.n_val": "validation samples (as n_train)",
    "dataset.path": "directory holding the data files (docs/datasets.md)",
    "dataset.variant": "the 220-band file (full), the 200-band one (corrected), or auto: "
                       "full if present",
    "dataset.grid": "grid points per axis of [-3, 3]²",
    "dataset.scaling": "grey level y to input: tanh(6y/255 - 3) + 1 (authors), y/255 "
                       "(unit), or y/255 standardised (standard)",
}


def _names(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


VALUES = {
    "dtype": DTYPES,
    "device": DEVICES,
    "logger": LOGGERS,
    "mode.name": MODES,
    "network.name": _names(KINDS),
    "network.activation": _names(ACTIVATIONS),
    "network.opening": "; ".join(f"{kind} nets: {' | '.join(names)}"
                                 for kind, names in OPENINGS.items()),
    "mgrit.cycle": CYCLES,
    "mgrit.coarse_weights": COARSE_WEIGHTS,
    "mgrit.control": CONTROLS,
    "mgrit.level_ops": LEVEL_OPS,
    "optimizer.name": _names(OPTIMIZER_OPTIONS),
    "optimizer.schedule": _names(SCHEDULES),
    "dataset.name": _names(LOADERS),
    "dataset.variant": VARIANTS,
    "dataset.scaling": tuple(SCALINGS),
}

