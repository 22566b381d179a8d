"""The user's residual step named by `network.step`: built from its `_target_`, checked,
and its parameters laid out as rows of θ.

`network=custom network.step._target_=mypkg.MyStep` (plus keyword arguments as further
keys of `network.step`) makes every layer f_n a `mypkg.MyStep(**kwargs)`: one module
structure, N sets of parameter values. Layer n's parameters are row n of the hidden
block K (N, p) of θ (model/network.py), in the order of `named_parameters()`, so the
optimizers, the regulariser, checkpoints and saved models treat them like the built-in
steps' weights; the module itself keeps only its structure and buffers. Its initial
parameters are those its constructor draws, from torch's generator seeded with the
run's seed (identical on every rank). Its buffers are the constructor's with torch's
seed set to TEMPLATE_SEED, so that a random fixed tensor is the same on every rank, in
every run, resume and loaded model (only θ is saved). The module runs in eval mode: a
step is a deterministic function of the state, as MGRIT needs. It is tried once in each
dtype and on each device it computes in (`steps`): it must keep the state's shape and
dtype there (custom_steps.py checks every step's result again).
"""
from __future__ import annotations

import copy
import importlib
import math

import torch
from torch import nn

from lptrain.errors import ConfigError, first_line
from lptrain.model.module_steps import ModuleSteps, kept_update, seeded

TARGET = "_target_"
TRIAL_BATCH = 2         # samples of the state the step is tried on when it is built
# two calls on one state may differ by this, relative to the update's size: a device's
# kernels may sum in another order from call to call, a random step differs by O(1)
REPEAT_TOL = 1e-4
INERT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
TEMPLATE_SEED = 0       # torch's seed while the module whose buffers every layer uses is built


def _held(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the module's parameters and buffers by name."""
    return {name: t.detach().clone() for name, t in
            [*module.named_parameters(), *module.named_buffers()]}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _gap(y: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """(largest |y − other|, largest |y|) where both are finite; (0, 0) where nowhere."""
    both = torch.isfinite(y) & torch.isfinite(other)
    if not both.any():
        return 0.0, 0.0
    return (y - other).abs()[both].max().item(), y[both].abs().max().item()


def resolve(path: str):
    """The object a dotted path names (`pkg.module.Name`), ConfigError if none."""
    key = f"network.step.{TARGET}={path!r}"
    if not isinstance(path, str) or not path.strip() or path.startswith(".") \
            or path.endswith("."):
        raise ConfigError(f"{key}: name the step's class as package.module.Class")
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not name.startswith(exc.name) \
                    and not exc.name.startswith(name):
                raise ConfigError(f"{key}: importing {name} failed: {exc}") from None
            continue
        except Exception as exc:        # the user's module fails to import
            raise ConfigError(f"{key}: importing {name} failed: "
                              f"{type(exc).__name__}: {first_line(exc)}") from None
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise ConfigError(f"{key}: {name} has no attribute {attr!r}")
            obj, name = getattr(obj, attr), f"{name}.{attr}"
        return obj
    raise ConfigError(f"{key}: no module {parts[0]!r} to import (is its package installed "
                      f"or on PYTHONPATH?)")


def check_spec(step: dict, required: bool = True) -> None:
    """ConfigError unless `step` holds a target (a string; may be left null unless
    `required`: the network=custom config leaves it to the command line) and keyword
    arguments."""
    if not isinstance(step, dict) or step.get(TARGET) is None:
        if required or not isinstance(step, dict):
            raise ConfigError(f"network.step: name your step's class, e.g. "
                              f"network.step.{TARGET}=mypkg.MyStep")
    target = step.get(TARGET)
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise ConfigError(f"network.step.{TARGET}={target!r}: name the step's class as "
                          f"package.module.Class")
    bad = [k for k in step if k != TARGET and (not isinstance(k, str) or k.startswith("_"))]
    if bad:
        raise ConfigError(f"network.step.{bad[0]}: not a keyword argument (only "
                          f"{TARGET} and the class's keyword arguments)")


class CustomStep:
    """The module structure of every layer, its parameters' layout in a row of θ."""

    def __init__(self, step: dict, state_shape: tuple[int, ...]):
        check_spec(step)
        self.target = step[TARGET]
        self.kwargs = {k: v for k, v in step.items() if k != TARGET}
        self.state_shape = tuple(state_shape)
        self._cls = resolve(self.target)
        if not callable(self._cls):
            raise ConfigError(f"network.step.{TARGET}={self.target!r}: not a class or "
                              f"function that builds a torch module")
        with seeded(TEMPLATE_SEED):     # its buffers: the same in every process
            self.template = self.build()
        named = list(self.template.named_parameters())
        if not named:
            raise ConfigError(f"network.step.{TARGET}={self.target!r}: the module has no "
                              f"parameters to train")
        frozen = [name for name, p in named if not p.requires_grad]
        if frozen:     # θ's rows are all trained: a frozen value would change silently
            raise ConfigError(f"network.step.{TARGET}={self.target!r}: parameter "
                              f"{frozen[0]!r} is frozen (requires_grad=False); every "
                              f"parameter of a step is trained: keep a fixed tensor as a "
                              f"buffer (register_buffer)")
        # modules whose training behaviour a step run in eval mode does not have
        self.inert = sorted({type(m).__name__ for m in self.template.modules()
                             if isinstance(m, INERT)})
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.size = sum(math.prod(s) for s in self.shapes)      # p: one row of θ
        self._copies: dict[tuple, ModuleSteps] = {}

    def flatten(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """One layer's (p,) row from {parameter name: tensor} (unflatten's inverse)."""
        return torch.cat([params[name].reshape(-1) for name in self.names])

    def _call(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.target}({args})"

    def build(self) -> nn.Module:
        """A fresh module (its constructor's initial parameters), in eval mode."""
        try:
            module = self._cls(**self.kwargs)
        except Exception as exc:
            raise ConfigError(f"{self.name} failed: {type(exc).__name__}: "
                              f"{first_line(exc)}") from None
        if not isinstance(module, nn.Module):
            raise ConfigError(f"{self.name} gave a {type(module).__name__}, not a "
                              f"torch.nn.Module")
        return module.double().eval()

    def _try(self, module: nn.Module, dtype: torch.dtype, device) -> None:
        """Run `module` (the template in `dtype` on `device`) twice on each of two small
        states of that dtype, the run's, zero and random: it must keep the state's shape
        and dtype (a float32 run whose step returned float64 trained silently in float64
        and saved a model that failed in torch), give finite values on one of them at
        least (a NaN was blamed on network.T and the data; a step defined for u >= 0
        alone, log1p, is finite at 0), and the same values both times (a random step
        trained on with gradient errors far above the controller's target)."""
        zero = torch.zeros(TRIAL_BATCH, *self.state_shape, dtype=dtype, device=device)
        with seeded(TEMPLATE_SEED):
            rand = torch.randn(TRIAL_BATCH, *self.state_shape, dtype=torch.float64)
        rand = rand.to(dtype=dtype, device=device)
        finite, before = False, _held(module)
        for u in (zero, rand):
            y, again = self._called(module, u), self._called(module, u)
            try:        # the rule every step of the run is held to (custom_steps.py)
                kept_update(self.name, u, y)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            finite = finite or bool(torch.isfinite(y).all())
            self._same_twice(y, again)
        self._unwritten(module, before)
        self._per_sample(module, rand, y)        # y: the update of the random batch
        if not finite:
            raise ConfigError(f"{self.name} returns non-finite values (nan or inf) for "
                              f"finite states of shape {tuple(zero.shape)} (batch, "
                              f"*state), zero and random")
        self._differentiable(module, rand)

    def _differentiable(self, module: nn.Module, u: torch.Tensor) -> None:
        """ConfigError where autograd through `module` at u, as every adjoint step runs
        it, fails, or reaches none of its parameters: a step that detaches them, or
        computes its update with autograd.grad without create_graph, had trained with
        its layers' gradients zero, silently."""
        x = u.clone().requires_grad_(True)
        params = [p for p in module.parameters() if p.requires_grad]
        try:
            with torch.enable_grad():
                y = module(x)
                grads = torch.autograd.grad(y, [x, *params], torch.ones_like(y),
                                            allow_unused=True) if y.requires_grad else []
        except Exception as exc:
            raise ConfigError(f"{self.name} fails under autograd (every adjoint step "
                              f"differentiates it) on a state of shape {tuple(u.shape)}: "
                              f"{type(exc).__name__}: {first_line(exc)}") from None
        if params and all(g is None for g in grads[1:]):
            raise ConfigError(f"{self.name}'s update does not depend on its parameters "
                              f"under autograd: it detaches them, or takes autograd.grad "
                              f"without create_graph=True, so its layers' gradients "
                              f"would be zero")

    def _same_twice(self, y: torch.Tensor, again: torch.Tensor) -> None:
        """ConfigError where two calls on one state differ beyond REPEAT_TOL of the
        update's size (where both are finite; or where one is and the other not)."""
        gap, scale = _gap(y, again)
        if gap > REPEAT_TOL * scale or not torch.equal(torch.isfinite(y),
                                                       torch.isfinite(again)):
            raise ConfigError(f"{self.name} gives another update for the same state when "
                              f"called again (largest difference {gap:.3g}): a step must "
                              f"be a deterministic function of the state, which MGRIT "
                              f"computes more than once")

    def _unwritten(self, module: nn.Module, before: dict) -> None:
        """ConfigError where calling the step changed its parameters or buffers (a
        weight clamped in place under no_grad): each call writes into θ's row of its
        layer, which the optimizer and the other ranks do not see (an mgrit run on two
        layer ranks had parted from one rank's at its first objective)."""
        params = dict(module.named_parameters())
        changed = [name for name, t in _held(module).items()      # one made in a call: new
                   if name in before and not _same(t, before[name])]
        if not changed:
            return
        if any(name in params for name in changed):
            why = ("its parameters are θ's rows, which the optimizer alone moves; constrain "
                   "a weight where it is used, e.g. weight.clamp(-c, c) in forward")
        else:
            why = "every layer shares its buffers, so a call's writes reach the others"
        raise ConfigError(f"{self.name} writes into its {', '.join(changed)} when called: "
                          f"a step must leave its parameters and buffers as they are ({why})")

    def _per_sample(self, module: nn.Module, u: torch.Tensor, together: torch.Tensor
                    ) -> None:
        """ConfigError where f of the batch u (`together`) differs from f of each sample
        alone beyond REPEAT_TOL of the update's size: a step that couples the samples (a
        mean over the batch) had trained to another model on every rank count and data
        split."""
        alone = torch.cat([self._called(module, u[i:i + 1]) for i in range(u.shape[0])])
        gap, scale = _gap(together, alone)
        if gap > REPEAT_TOL * scale:
            raise ConfigError(f"{self.name} couples the samples of a batch (a sample's "
                              f"update changes by {gap:.3g} with the others beside it): "
                              f"lptrain splits batches over ranks and evaluates in other "
                              f"batches, so a step must act on each sample alone")

    def _called(self, module: nn.Module, u: torch.Tensor):
        """module(u) without a graph; ConfigError naming the step where it raises."""
        try:
            with torch.no_grad():
                return module(u)
        except Exception as exc:
            raise ConfigError(f"{self.name} fails on a state of shape {tuple(u.shape)} "
                              f"(batch, *state): {type(exc).__name__}: "
                              f"{first_line(exc)}") from None

    # -- parameters ------------------------------------------------------------------
    def initial(self, n_layers: int, seed: int) -> torch.Tensor:
        """(N, p) float64: the parameters of N freshly built layers, drawn from torch's
        generator seeded with `seed` (the global generator is left as it was)."""
        rows = torch.empty(n_layers, self.size, dtype=torch.float64)
        with seeded(seed):
            for n in range(n_layers):
                rows[n] = self.flatten(dict(self.build().named_parameters())).detach()
        return rows

    def unflatten(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """{parameter name: view of `row`} of one layer's (p,) row of θ (as ModuleSteps
        takes parameters)."""
        out, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            size = math.prod(shape)
            out[name] = row.narrow(0, offset, size).view(shape)
            offset += size
        return out

    def steps(self, dtype: torch.dtype, device) -> ModuleSteps:
        """The template in this dtype and on this device (its buffers converted) as the
        one layer of a ModuleSteps (model/module_steps.py); every layer of θ runs it with
        its own row of parameters. Kept per dtype and device, each tried when made
        (ConfigError unless it keeps a state's shape and dtype there)."""
        key = (dtype, str(device))
        if key not in self._copies:
            module = copy.deepcopy(self.template).to(dtype=dtype, device=device)
            self._try(module, dtype, device)
            self._copies[key] = ModuleSteps([module])
        return self._copies[key]

    @property
    def name(self) -> str:
        """'network.step: pkg.Class(kwargs)': who a refusal or a failed step names."""
        return f"network.step: {self._call()}"
