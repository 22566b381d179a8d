"""A saved ODE-ResNet as an ordinary torch module: parameters, gradients, raw-input prediction.

`load_model(run_dir)` (model/saved.py) returns a `Classifier`. Its parameters are the
blocks of the network's flat layout as `nn.Parameter`s (`open_K`, `open_b` where the
opening has weights, `K`, `b`, `W`, `mu`), so it fine-tunes like any module: `forward`
steps the layers with autograd. `evaluate` steps them as the training code's serial
validation does, so on the run's validation split it gives the run's numbers.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from lptrain.data import preprocessing
from lptrain.data.base import chunks
from lptrain.errors import NonFiniteLogitsError
from lptrain.model.dtypes import DTYPES
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.signature import check_fits
from lptrain.model.serial import propagate

EVAL_CHUNK = 4096   # samples `evaluate` steps at once


class Classifier(nn.Module):
    """A trained ODE-ResNet: `model(x)` gives the class scores (logits) of features x.

    Features are samples as the dataset's loader returns them, of shape (batch,
    *feature_shape), i.e. after its preprocessing; `predict` takes raw samples and applies
    that preprocessing (`preprocessing`, recorded by the loader) itself.  `which` says
    whose parameters these are ("best": the best validation; "last": the last good
    iteration), `iteration` after which iteration, `validation` their validation (loss,
    accuracy) or None.
    """

    def __init__(self, record: dict, source: str = "saved model"):
        super().__init__()
        self.net = ResNet(NetworkOptions(**record["network"]), tuple(record["feature_shape"]),
                          record["n_classes"])
        theta = record["theta"].to(DTYPES[record["dtype"]])
        check_fits(self.net, record.get("signature"), theta, source)
        for name, view in self.net.layout.views(theta).items():   # layout order
            self.register_parameter(name, nn.Parameter(view.clone()))
        self.which = record.get("which", "last")
        self.iteration = record["iteration"]
        validation = record.get("validation")
        self.validation = None if validation is None else tuple(validation)
        self.validation_chunk = record.get("validation_chunk")   # absent before: None
        self.config_yaml = record["config"]
        self.dataset_name = record["dataset"]["name"]
        self.dataset_meta = record["dataset"]["meta"]
        self.dataset_source = record["dataset"].get("source")
        self.preprocessing = self.dataset_meta.get("preprocessing")
        self._convert_step()

    def _apply(self, fn, recurse=True):
        """nn.Module's conversions (.to, .double, .cuda ...), the user's step with them."""
        out = super()._apply(fn, recurse)
        self._convert_step()
        return out

    def _convert_step(self) -> None:
        """A user's step (network=custom) converted now to the parameters' dtype and
        device, not in the first forward: torch.export traces that one, and a module
        converted while it traces fails ("Couldn't swap Linear.weight")."""
        if self.net.custom is not None:
            p = next(self.parameters())
            self.net.custom.steps(p.dtype, p.device)

    def extra_repr(self) -> str:
        """What print(model) says: network, data, and whose parameters these are."""
        o = self.net.opts
        step = o.step.get("_target_", o.name) if o.step else o.name
        state = f"width {o.width}" if o.opening in ("dense", "pad") else f"{o.channels} channels"
        seen = "" if self.validation is None else f", validation accuracy {self.validation[1]:.4g}"
        act = f"{o.activation} opening" if o.step else o.activation   # a user's step: theirs
        return (f"{step}: {o.layers} layers, {state}, T={o.T:g}, {act}; "
                f"{self.dataset_name}, features {tuple(self.feature_shape)}, "
                f"{self.n_classes} classes; {self.which} parameters after iteration "
                f"{self.iteration}{seen}")

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return self.net.in_shape

    @property
    def n_classes(self) -> int:
        return self.net.n_classes

    @property
    def theta(self) -> torch.Tensor:
        """The parameters as one flat vector in the network's layout (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])

    def step_module(self, n: int) -> nn.Module:
        """Layer n's step of a network=custom model as the user's own module, a copy: its
        parameters by their own names (`inner.weight`, ...) with layer n's values, its
        buffers those every layer uses; f_n(u) = step_module(n)(u)."""
        custom, layers = self.net.custom, self.net.opts.layers
        if custom is None:
            raise ValueError(f"step_module: network={self.net.opts.name} steps with K and "
                             f"b, no module of its own (network=custom models have one)")
        if not 0 <= n < layers:
            raise IndexError(f"step_module: layer {n} of a network of {layers} (0 to "
                             f"{layers - 1})")
        K, _ = self.net.hidden_views(self.theta)
        module, rows = copy.deepcopy(custom.template), custom.unflatten(K[n])
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(rows[name])
        return module.to(dtype=K.dtype, device=K.device)

    def _flat(self) -> torch.Tensor:
        """θ assembled from the parameters, differentiable (the network reads views of it)."""
        return torch.cat([p.reshape(-1) for p in self.parameters()])

    def _features(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[1:]) != self.net.in_shape:
            raise ValueError(f"input of shape {tuple(x.shape)}: expected (batch, "
                             f"{', '.join(map(str, self.net.in_shape))})")
        return x.to(dtype=theta.dtype, device=theta.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (batch, n_classes) of features x; differentiable in the parameters and x."""
        net, theta = self.net, self._flat()
        x = self._features(x, theta)
        u, stepper = net.opening(theta, x), net.stepper(theta)
        for n in range(net.opts.layers):      # u_{n+1} = u_n + h·σ(K_n u_n + b_n)
            u = stepper.step(u, n, net.h)
        return net.logits(theta, u)

    def preprocess(self, raw) -> torch.Tensor:
        """Features of raw samples (a tensor or numpy array of shape (batch, ...) holding
        prod(feature_shape) values per sample, e.g. MNIST grey levels 0..255 as (n, 28, 28)),
        by the preprocessing the dataset's loader applied."""
        if self.preprocessing is None:
            raise ValueError("this model records no preprocessing (saved by an earlier "
                             "lptrain): pass features and preprocessed=True")
        x = as_tensor(raw)
        size = math.prod(self.feature_shape)
        if x.dim() < 2 or math.prod(x.shape[1:]) != size:
            raise ValueError(f"input of shape {tuple(x.shape)}: expected (batch, ...) with "
                             f"{size} values per sample, e.g. (batch, "
                             f"{', '.join(map(str, self.feature_shape))})")
        x = x.to(dtype=torch.float64).reshape(x.shape[0], *self.feature_shape)
        if not torch.isfinite(x).all():
            raise ValueError("input holds nan or infinite values")
        return preprocessing.apply(self.preprocessing, x)

    @torch.no_grad()
    def predict(self, x, preprocessed: bool = False):
        """The most likely class of every sample: int64, a numpy array for numpy input,
        else a tensor. x holds raw samples (see `preprocess`), or features with
        `preprocessed=True`. NonFiniteLogitsError where a sample's logits hold NaN or
        ±inf: no class is the likeliest there (`evaluate` counts such a sample a miss)."""
        features = as_tensor(x) if preprocessed else self.preprocess(x)
        logits = self.forward(features)
        bad = torch.nonzero(~torch.isfinite(logits).all(1)).squeeze(1)
        if bad.numel():
            raise NonFiniteLogitsError(bad.cpu(), logits.shape[0])
        classes = logits.argmax(1)
        return classes.cpu().numpy() if isinstance(x, np.ndarray) else classes

    def _final_states(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        x = self._features(x, theta)
        states, _ = propagate(self.net.stepper(theta), self.net.opening(theta, x), self.net.h,
                              False)
        return states[-1]

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor,
                 chunk: int | None = None) -> tuple[float, float]:
        """Mean cross-entropy loss and accuracy (0..1) on the features x with labels y,
        stepped `chunk` samples at a time (memory; the numbers are those of one pass
        to rounding). By default the chunks the run validated in (`validation_chunk`:
        a serial run on one rank's numbers bitwise; float32 sums of other chunks differ
        in the last bit), else EVAL_CHUNK. numpy or torch input; labels of any integer type.
        A sample whose logits are not finite is a miss (where `predict` refuses), as in
        the run's own validation."""
        if chunk is not None and chunk < 1:
            raise ValueError(f"evaluate: chunk={chunk}; give at least 1 sample (None: the "
                             f"run's validation chunks)")
        chunk = chunk or self.validation_chunk or EVAL_CHUNK
        x, y = as_tensor(x), as_tensor(y)
        if x.shape[0] == 0 or y.shape != (x.shape[0],):
            raise ValueError(f"evaluate: {x.shape[0]} samples with labels of shape "
                             f"{tuple(y.shape)}; give one label for each of at least one "
                             f"sample")
        if y.dtype.is_floating_point or y.dtype == torch.bool:
            raise ValueError(f"evaluate: labels of dtype {y.dtype}; give class indices")
        y = y.long()
        bad = ((y < 0) | (y >= self.n_classes)).nonzero()
        if len(bad):
            raise ValueError(f"evaluate: label {int(y[bad[0, 0]])} of sample "
                             f"{int(bad[0, 0])}; the model's classes are 0 to "
                             f"{self.n_classes - 1} ({len(bad)} labels outside)")
        n, loss, correct, theta = x.shape[0], 0.0, 0, self._flat()
        for part in chunks(n, chunk):
            l, c, *_ = self.net.classify(theta, self._final_states(x[part], theta),
                                         y[part].to(theta.device), n, False)
            loss, correct = loss + float(l), correct + c
        return loss, correct / n


def as_tensor(a) -> torch.Tensor:
    """A user's tensor, or their array (list, numpy) as one: a read-only numpy array
    (np.frombuffer, a memory map) is copied, which torch.as_tensor shares with a
    warning that writing it is undefined."""
    if torch.is_tensor(a):
        return a
    a = np.asarray(a)
    return torch.as_tensor(a if a.flags.writeable else a.copy())
