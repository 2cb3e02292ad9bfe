"""The finetuning protocols of the robust-SSL literature: SLF, ALF and AFF.

- SLF (standard linear finetuning): under the uniform recipe :func:`..probe.fit_linear_probe`, a
  linear head on cached clean features of the frozen encoder; under a named recipe (robustssl)
  :func:`train_slf_head`, SGD on features re-encoded from augmented images.
- ALF (adversarial linear finetuning): the encoder frozen in eval mode, a linear head trained on PGD
  examples made end to end through normalisation -> encoder -> head (:func:`train_alf_head`).
- AFF (adversarial full finetuning): encoder and head trained together with TRADES, batch-norm in
  train mode for the update and eval mode for the inner maximisation (:func:`train_aff`); on a
  dual-BN encoder the authors' dual-BN TRADES (clean branch for x, adversarial branch for x_adv).

Defaults and their public sources are in docs/decisions.md, 'Finetuning protocols'; the epoch loop,
its resume and the augmentation are eval/finetune_loop.py, the named recipes
eval/finetune_recipes.py. What is attacked afterwards obeys the project's contract: a
:class:`ProbedClassifier` from [0,1] images to logits, eval mode, frozen, normalisation inside.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save as st_save
from torch import Tensor, nn

from ..attack.grad import input_grad
from ..data import ImageData
from ..errors import UserError
from ..io import canonical_json, sha256_bytes, write_bytes_atomic
from ..models.dual_bn import bn_route, has_dual_bn, set_bn_momentum, set_bn_route
from ..models.features import extract_features, feature_scaler, knn_accuracy
from ..results.finetune import (
    ALF_FITS,
    BN_MOMENTA,
    PROTOCOLS,
    AffConfig,
    AlfConfig,
    FinetuneConfig,
    SlfConfig,
    dual_bn_on,
    fitted_schedule,
    resolve_dual_bn,
    resolved_step,
)
from ..results.label_free import LABEL_FREE
from .finetune_loop import Run, run_epochs
from .probe import (
    ProbeConfig,
    ProbedClassifier,
    ProbeResult,
    fit_head_on_features,
    fold_standardization,
    scaled,
)

STATE_DIR = "finetune-state"  # per-epoch resume states, under the evaluation's output folder
WEIGHTS_DIR = "finetuned"  # AFF weights, content-addressed: finetuned/<sha256>.safetensors
#: the (clean, adversarial) BatchNorm routes of dual-BN TRADES: DynACL test_AFF.py and the benchmark's
#: ``trades_loss_dual(natural_mode='normal')`` send x through 'normal' and x_adv through 'pgd'
DUAL_ROUTES = ("clean", "adv")


def parse_protocols(text: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"slf,alf"`` -> ``["slf", "alf"]`` (order kept, duplicates dropped); one-line UserError otherwise.

    ``label-free`` (eval/label_free.py: no head, no finetuning) is accepted beside the finetuning
    protocols; :func:`finetuning_protocols` drops it for the code that fits classifiers."""
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in str(t).split(",")]
    names = [p.strip().lower() for p in parts]
    valid = (*PROTOCOLS, LABEL_FREE)
    bad = [p for p in names if p not in valid]
    if bad or not names:
        raise UserError(
            f"protocol {','.join(bad) or text!r}: choose one or more of "
            f"{', '.join(valid)}, comma-separated (e.g. slf,alf,aff)"
        )
    return list(dict.fromkeys(names))


def finetuning_protocols(text: str | list[str] | tuple[str, ...]) -> list[str]:
    """The protocols of ``text`` that fit a classifier (slf, alf, aff): label-free left out."""
    return [p for p in parse_protocols(text) if p != LABEL_FREE]


# ============ the training adversaries ============


def pgd_training_examples(
    model: nn.Module, x: Tensor, y: Tensor, *, eps: float, step_size: float, steps: int, gen: torch.Generator
) -> Tensor:
    """Madry's PGD-AT adversary: uniform start in the Linf ball, ``steps`` signed steps on the summed
    cross-entropy, projection onto ball and [0,1]. Every example is attacked for every step (no
    early stop: a training adversary, unlike the evaluation's). ``model`` is used as it is (eval)."""
    noise = torch.rand(x.shape, generator=gen, dtype=x.dtype).to(x.device)
    lo, hi = _box(x, eps)
    x_adv = (x + (noise * 2 - 1) * eps).clamp(0.0, 1.0)
    for _ in range(steps):
        g, _ = input_grad(model, x_adv, y)
        x_adv = torch.clamp(x_adv + step_size * g.sign(), lo, hi)
    return x_adv


def _box(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The Linf ball around ``x`` intersected with [0,1], as per-pixel bounds: one clamp per step
    projects onto it (the same values as clipping to the ball, then to [0,1])."""
    return (x - eps).clamp_(min=0.0), (x + eps).clamp_(max=1.0)


@contextlib.contextmanager
def _routed(model: nn.Module, route: str | None) -> Iterator[None]:
    """``bn_route(model, route)``, or nothing when ``route`` is None (single-route training)."""
    if route is None:
        yield
        return
    with bn_route(model, route):
        yield


def trades_examples(
    model: nn.Module,
    x: Tensor,
    p_nat: Tensor,
    *,
    eps: float,
    step_size: float,
    steps: int,
    gen: torch.Generator,
    route: str | None = None,
) -> Tensor:
    """TRADES' inner maximisation: start at ``x + 0.001 N(0,1)``, ``steps`` signed steps on
    ``KL(p_nat || p(x_adv))`` (summed), projection onto ball and [0,1]. ``p_nat``: the clean
    probabilities (eval mode), a constant; ``route``: the BatchNorm branch x_adv goes through
    (dual-BN TRADES: 'adv', while ``p_nat`` came through 'clean'; None: the model as it is)."""
    x_adv = x + 0.001 * torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device)
    lo, hi = _box(x, eps)
    for _ in range(steps):
        x_adv = x_adv.detach().requires_grad_(True)
        with torch.enable_grad(), _routed(model, route):
            kl = F.kl_div(F.log_softmax(model(x_adv), dim=1), p_nat, reduction="sum")
            (g,) = torch.autograd.grad(kl, x_adv)
        x_adv = torch.clamp(x_adv.detach() + step_size * g.sign(), lo, hi)
    return x_adv.detach()


def trades_loss(
    model: nn.Module,
    x: Tensor,
    x_adv: Tensor,
    y: Tensor,
    beta: float,
    routes: tuple[str, str] | None = None,
) -> Tensor:
    """TRADES' outer loss: ``CE(f(x), y) + beta * KL(p(x) || p(x_adv)) / B`` (model as it is: train).
    ``routes``: the BatchNorm branches of the clean and the adversarial forward (dual-BN TRADES,
    :data:`DUAL_ROUTES`); each forward updates its own branch's running statistics."""
    clean, adv = routes or (None, None)
    with _routed(model, clean):
        logits = model(x)
    with _routed(model, adv):
        logits_adv = model(x_adv)
    kl = F.kl_div(F.log_softmax(logits_adv, dim=1), F.softmax(logits, dim=1), reduction="sum")
    return F.cross_entropy(logits, y) + beta * kl / len(x)


# ============ SLF, ALF and AFF ============


def init_head(dim: int, num_classes: int, seed: int, device: torch.device | str = "cpu") -> nn.Linear:
    """A linear head initialised as the SLF probe's: U(-1/sqrt(d), 1/sqrt(d)) from ``seed``, weight
    then bias, drawn on the CPU."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    head = nn.Linear(dim, num_classes)
    with torch.no_grad():
        bound = 1.0 / dim**0.5
        head.weight.copy_(torch.empty_like(head.weight).uniform_(-bound, bound, generator=gen))
        head.bias.copy_(torch.empty_like(head.bias).uniform_(-bound, bound, generator=gen))
    return head.to(device)


def zero_head(dim: int, num_classes: int, seed: int, device: torch.device | str = "cpu") -> nn.Linear:
    """A linear head of zeros (the RobustSSL benchmark's ``fc.weight/fc.bias = zeros``); ``seed`` unused."""
    head = nn.Linear(dim, num_classes)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return head.to(device)


#: ``head_init`` -> how a finetuned head starts
HEAD_INIT: dict[str, Callable[..., nn.Linear]] = {"uniform": init_head, "zeros": zero_head}


def make_head(cfg: FinetuneConfig, encoder: nn.Module, data: ImageData, seed: int) -> nn.Linear:
    """The head a protocol starts from, as ``cfg.head_init`` says, on the encoder's device."""
    device = next(encoder.parameters()).device
    return HEAD_INIT[cfg.head_init](_feature_dim(encoder, data), data.num_classes, seed, device)


def train_slf_head(
    encoder: nn.Module,
    train: ImageData,
    cfg: SlfConfig | None = None,
    *,
    seed: int = 0,
    head: nn.Linear | None = None,
    state_path: str | Path | None = None,
    progress: bool = False,
) -> nn.Linear:
    """SLF by SGD (the benchmark's): a linear head on features re-encoded from every (augmented)
    batch by the frozen encoder in eval mode; mean cross-entropy. Returns the new head."""
    cfg = cfg or SlfConfig()
    cfg.check()
    encoder.eval().requires_grad_(False)
    head = make_head(cfg, encoder, train, seed) if head is None else copy.deepcopy(head)
    head.requires_grad_(True)

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> None:
        with torch.no_grad():
            f = encoder(x)
        F.cross_entropy(head(f), y).backward()

    run = Run(
        cfg, {"head": head}, list(head.parameters()), train.x, train.y, seed, _path(state_path), progress
    )
    run_epochs(run, step)
    return head.requires_grad_(False)


def train_alf_head(
    encoder: nn.Module,
    train: ImageData,
    cfg: AlfConfig | None = None,
    *,
    seed: int = 0,
    head: nn.Linear | None = None,
    state_path: str | Path | None = None,
    progress: bool = False,
) -> nn.Linear:
    """ALF: train a linear head on PGD examples through the frozen encoder (eval mode, unchanged).

    ``head`` starts the training (default: ``cfg.head_init`` from ``seed``; it is copied, not
    modified). Per batch: ``cfg.steps`` PGD steps through encoder and current head, then one SGD
    step on the mean cross-entropy of the head on the adversarial features. ``cfg.fit``
    (:data:`ALF_FITS`) may lengthen the schedule (:func:`fitted_schedule`) and put a standardisation
    of the clean training features before the head: the attack and the update then see
    encoder -> standardise -> head, and the returned head has the standardisation folded in, so
    that encoder -> head is the same function (the model the evaluation attacks). Returns the head.
    """
    cfg = cfg or AlfConfig()
    cfg.check()
    encoder.eval().requires_grad_(False)
    head = make_head(cfg, encoder, train, seed) if head is None else copy.deepcopy(head)
    head.requires_grad_(True)
    fit = ALF_FITS[cfg.fit]
    # the SLF probe's standardisation (its statistics on the clean training features); one scaler
    # for the whole run, recomputed identically on a resume
    scaler = feature_scaler(extract_features(encoder, train.x, keep_device=True)) if fit.standardize else None
    trained: nn.Module = head if scaler is None else nn.Sequential(_Standardize(*scaler), head)
    attacked = _Frozen(encoder, trained)
    step_size = resolved_step(cfg)

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> None:
        x_adv = pgd_training_examples(
            attacked, x, y, eps=cfg.eps, step_size=step_size, steps=cfg.steps, gen=gen
        )
        with torch.no_grad():
            f = encoder(x_adv)
        F.cross_entropy(trained(f), y).backward()

    schedule = fitted_schedule(cfg, len(train))
    run = Run(
        schedule,
        {"head": head},
        list(head.parameters()),
        train.x,
        train.y,
        seed,
        _path(state_path),
        progress,
        save_every=max(1, schedule.epochs // cfg.epochs),  # about once per recipe epoch
    )
    run_epochs(run, step)
    if scaler is not None:
        fold_standardization(head, *scaler)
    return head.requires_grad_(False)


class _Standardize(nn.Module):
    """``(f - mean) / scale``: the probe's feature standardisation as a layer (constants)."""

    def __init__(self, mean: Tensor, scale: Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("scale", scale.detach().clone())

    def forward(self, f: Tensor) -> Tensor:
        return scaled(f, (self.mean, self.scale))


def train_aff(
    encoder: nn.Module,
    head: nn.Linear,
    train: ImageData,
    cfg: AffConfig | None = None,
    *,
    seed: int = 0,
    state_path: str | Path | None = None,
    progress: bool = False,
) -> tuple[nn.Module, nn.Linear]:
    """AFF: TRADES on encoder and head together; returns finetuned copies (eval mode, frozen).

    Per batch: clean probabilities and ``cfg.steps`` inner steps with the whole model in eval mode
    (the authors' ``model.eval()`` in ``trades_loss``), then the outer loss with batch-norm in train
    mode and one SGD step. On a dual-BN encoder (``cfg.dual_bn`` auto/on) every clean forward takes
    the clean branch and every forward of x_adv the adversarial one, which is then the branch the
    returned encoder evaluates (DynACL ``test_AFF.py``, the benchmark's ``trades_loss_dual``).
    ``head`` is where the head starts (a fresh head for AFF, a linear probe's head for LP-AFT /
    DynACL++); inputs are never modified.
    """
    cfg = cfg or AffConfig()
    cfg.check()
    model = nn.Sequential(copy.deepcopy(encoder), copy.deepcopy(head))
    model.requires_grad_(True)
    step_size = resolved_step(cfg)
    dual = dual_bn_on(cfg, has_dual_bn(model))
    clean, adv = DUAL_ROUTES if dual else (None, None)
    if dual and (momentum := BN_MOMENTA[cfg.bn_momentum]) is not None:
        # the authors' two branches are nn.BatchNorm2d (momentum 0.1); a loaded DualBatchNorm's
        # adversarial branch has CLAE's 0.01, which over AFF's 200 steps here lags far behind the
        # weights it normalises (docs/decisions.md, 'Finetuning protocols')
        set_bn_momentum(model, momentum, main=momentum)

    def step(x: Tensor, y: Tensor, gen: torch.Generator) -> None:
        model.eval()
        with torch.no_grad(), _routed(model, clean):
            p_nat = F.softmax(model(x), dim=1)
        x_adv = trades_examples(
            model, x, p_nat, eps=cfg.eps, step_size=step_size, steps=cfg.steps, gen=gen, route=adv
        )
        model.train()
        trades_loss(model, x, x_adv, y, cfg.beta, DUAL_ROUTES if dual else None).backward()

    run = Run(
        cfg, {"model": model}, list(model.parameters()), train.x, train.y, seed, _path(state_path), progress
    )
    run_epochs(run, step)
    if dual:  # the authors export and evaluate the 'pgd' branch (cvt_state_dict_AFF, bnNameCnt 1)
        set_bn_route(model, "adv")
    model.eval().requires_grad_(False)
    return model[0], model[1]


class _Frozen(nn.Module):
    """encoder -> head for generating attacks: eval mode, gradients only w.r.t. the input matter."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


def _feature_dim(encoder: nn.Module, data: ImageData) -> int:
    with torch.no_grad():
        return int(encoder(data.x[:1].to(next(encoder.parameters()).device).float().div(255)).shape[1])


def _path(p: str | Path | None) -> Path | None:
    return None if p is None else Path(p)


# ============ the protocol as evaluate() runs it ============


def run_key(identity: dict[str, Any], **parts: Any) -> str:
    """A short content hash naming a finetuning run's state file."""
    return sha256_bytes(canonical_json({"finetune": identity, **parts}).encode())[:24]


def save_weights(out: Path, classifier: nn.Module) -> str:
    """Write the classifier's state dict as ``out/finetuned/<sha256>.safetensors``; returns the sha256."""
    state = {k: v.detach().cpu().contiguous().clone() for k, v in classifier.state_dict().items()}
    data = st_save(state)
    sha = sha256_bytes(data)
    path = out / WEIGHTS_DIR / f"{sha}.safetensors"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)
    return sha


def fit_protocol(
    cfg: FinetuneConfig,
    encoder: nn.Module,
    train: ImageData,
    test: ImageData,
    probe: ProbeConfig,
    *,
    out: Path,
    key: str,
    progress: bool = False,
) -> tuple[ProbedClassifier, ProbeResult, dict[str, Any]]:
    """Run a finetuning protocol for ``evaluate``: (attacked classifier, clean metrics, row fields).

    ``cfg``: ALF, AFF, or a named recipe's SLF (the uniform recipe's SLF is the probe, not this).
    ``encoder`` is the evaluation's private copy. The probe's ``seed`` and ``max_train`` apply (head
    initialisation, training subset; ``cfg.max_train``, when set, instead); its epochs/lr are the
    cached probe's and unused here. AFF's weights are written content-addressed under
    ``out/finetuned/`` and their sha256 is a row field.
    """
    seed = 0 if probe.seed is None else probe.seed
    n = cfg.max_train if cfg.max_train is not None else probe.max_train
    if n is not None:
        train = dataclasses.replace(train, x=train.x[:n], y=train.y[:n])
    if isinstance(cfg, AffConfig):  # evaluate resolved it already: the identity must be the planned one
        cfg = resolve_dual_bn(cfg, has_dual_bn(encoder))
    state = out / STATE_DIR / f"{key}.pt"
    classifier = _TRAINERS[cfg.protocol](cfg, encoder, train, seed, state, progress)
    fields: dict[str, Any] = {"finetune": cfg.identity()}
    if isinstance(cfg, AffConfig):
        fields["finetuned_sha256"] = save_weights(out, classifier)
    metrics, reference = _metrics(classifier, train, test, probe, cfg)
    if isinstance(cfg, AlfConfig):  # what the fitted schedule ran, and the underfit check's reference
        fields["finetune_epochs"] = metrics.best_epoch  # the last epoch of the run: its length
        fields["slf_train_acc"] = reference
    return classifier, metrics, fields


def _fit_slf(
    cfg: Any, encoder: nn.Module, train: ImageData, seed: int, state: Path, progress: bool
) -> ProbedClassifier:
    head = train_slf_head(encoder, train, cfg, seed=seed, state_path=state, progress=progress)
    return ProbedClassifier(encoder, head)


def _fit_alf(
    cfg: Any, encoder: nn.Module, train: ImageData, seed: int, state: Path, progress: bool
) -> ProbedClassifier:
    head = train_alf_head(encoder, train, cfg, seed=seed, state_path=state, progress=progress)
    return ProbedClassifier(encoder, head)


def _fit_aff(
    cfg: Any, encoder: nn.Module, train: ImageData, seed: int, state: Path, progress: bool
) -> ProbedClassifier:
    encoder.eval()
    head0 = make_head(cfg, encoder, train, seed)
    encoder, head = train_aff(encoder, head0, train, cfg, seed=seed, state_path=state, progress=progress)
    return ProbedClassifier(encoder, head)


#: protocol -> how fit_protocol trains its classifier (SLF here: a named recipe's SGD head)
_TRAINERS: dict[str, Callable[..., ProbedClassifier]] = {"slf": _fit_slf, "alf": _fit_alf, "aff": _fit_aff}


def _metrics(
    classifier: ProbedClassifier, train: ImageData, test: ImageData, probe: ProbeConfig, cfg: FinetuneConfig
) -> tuple[ProbeResult, float | None]:
    """Clean metrics of the finetuned classifier, in the fields SLF's probe reports, and (ALF only)
    the train accuracy of the SLF probe (``probe``'s settings) fitted on the same clean training
    features: the reference of the ``alf_underfit`` check (eval/sanity.py)."""
    f_train = extract_features(classifier.encoder, train.x)  # on the CPU
    f_test = extract_features(classifier.encoder, test.x)
    w, b = (t.detach().cpu() for t in (classifier.head.weight, classifier.head.bias))

    def acc(f: Tensor, y: Tensor) -> float:
        return float(((f @ w.T + b).argmax(1) == y).float().mean()) if len(f) else float("nan")

    test_acc = acc(f_test, test.y)
    knn = knn_accuracy(
        f_train.cpu(),
        train.y,
        f_test.cpu(),
        test.y,
        num_classes=train.num_classes,
        k=probe.knn_k,
        t=probe.knn_t,
    )
    result = ProbeResult(
        test_acc=test_acc,
        best_test_acc=test_acc,  # no selection over epochs: the last epoch is the model
        best_epoch=fitted_schedule(cfg, len(train)).epochs if isinstance(cfg, AlfConfig) else cfg.epochs,
        train_acc=acc(f_train, train.y),
        knn_acc=knn,
        n_train=len(train),
        n_test=len(test),
        config=probe.as_dict(),
    )
    return result, _slf_train_acc(f_train, f_test, train, test, probe) if isinstance(cfg, AlfConfig) else None


def _slf_train_acc(
    f_train: Tensor, f_test: Tensor, train: ImageData, test: ImageData, probe: ProbeConfig
) -> float:
    """Train accuracy of the SLF probe (the run's probe settings, its seed) on cached clean features:
    what a linear head reaches on these training images, seconds on cached features."""
    if not len(f_train):
        return float("nan")
    head, _, _ = fit_head_on_features(f_train, train.y, f_test, test.y, train.num_classes, probe)
    with torch.no_grad():
        return float((head(f_train).argmax(1) == train.y).float().mean())
