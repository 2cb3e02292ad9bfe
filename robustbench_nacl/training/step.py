"""One optimisation step (:class:`TrainStep`) and the model it steps (:func:`build_model`).

``train`` runs exactly this code for every batch, and so do the benchmarks in ``bench/``.
"""

from __future__ import annotations

import math

import torch

from .. import losses
from ..accel import CompilePlan, compile_module, compile_plan
from ..augment import views as augment
from ..data import normalization
from ..errors import NonFiniteLoss
from ..losses.adversarial import StepContext
from ..losses.objectives import Objective
from ..models.dual_bn import set_bn_momentum
from ..models.factory import create_encoder
from ..models.heads import ContrastiveModel
from .config import TrainConfig


def build_model(
    cfg: TrainConfig, params: losses.LossParams, *, channels: int, size: tuple[int, int], num_classes: int
) -> ContrastiveModel:
    """Encoder (with its normalisation) + head, as the loss's declared needs ask, in ``cfg``'s memory format.

    The memory format is set here, not by each caller, so that everything that builds the trainer's
    model (``train``, the benchmarks) runs the kernels ``train`` runs: channels-last weights under the
    channels-last views ``TrainStep`` feeds when ``cfg.channels_last``.
    """
    need = losses.needs(params)
    mean, std = normalization(cfg.dataset)
    encoder = create_encoder(
        cfg.encoder,
        in_channels=channels,
        mean=mean,
        std=std,
        dual_bn=need.adversarial and params.dual_bn,
        input_shape=(channels, *size),
        **cfg.encoder_kwargs,
    )
    # dual BN in the head exactly when the encoder has it (ContrastiveModel's default)
    model = ContrastiveModel(encoder, params.head, out_dim=num_classes if need.labels else None)
    aux_momentum = params.extra_params().get("aux_bn_momentum")
    if aux_momentum is not None:  # ACL's two BatchNorms are alike (momentum 0.1), CLAE's aux uses 0.01
        set_bn_momentum(model, float(aux_momentum))
    prepare = losses.OBJECTIVES.get(params.objective).prepare
    if prepare is not None:  # before any resumed state is loaded into the model (the trainer's order)
        prepare(model, params)
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def exported(model: torch.nn.Module, params: losses.LossParams) -> ContrastiveModel:
    """The network a checkpoint holds and the monitor reads: the objective's ``export`` (DynACL's EMA
    network), else the trained model (unwrapped from DistributedDataParallel)."""
    export = losses.OBJECTIVES.get(params.objective).export
    model = getattr(model, "module", model)
    return export(model, params) if export is not None else model  # type: ignore[return-value]


class TrainStep:
    """The trainer's optimisation step: draw the views, forward them, the loss, backward, optimizer step.

    ``step(x, y, gen)`` takes one batch of raw training images (uint8 or float in [0, 1]) and labels
    and returns ``(loss, stats)``: the detached loss and the objective's statistics, as 0-dim
    tensors on the device. Nothing here waits for the device (no ``.item()``): the caller reads the
    values out once per epoch and checks them then (:func:`epoch_values`, :class:`NonFiniteLoss`).

    Under ``precision="bf16"`` the step only opens ``torch.autocast`` around the objective: the views
    are handed over in the view maker's dtype (float32), never cast here, and the objective computes
    the loss itself in float32 (see docs/decisions.md, 'Precision').

    ``compile``: the step's :class:`~robustbench_nacl.accel.CompilePlan` (None: ``cfg.compile`` on the
    model's device). When it compiles, the objective calls ``torch.compile(model)`` (its forward and
    backward; the views, the loss and the optimizer step stay eager); eager, nothing here changes.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        params: losses.LossParams,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        objective: Objective | None = None,
        view_maker: augment.ViewMaker | None = None,
        compile: CompilePlan | None = None,
    ) -> None:
        self.cfg, self.params, self.model, self.optimizer = cfg, params, model, optimizer
        self.device = next(model.parameters()).device
        self.compile = compile if compile is not None else compile_plan(cfg.compile, self.device, "train")
        self.net = compile_module(model, self.compile)  # what the objective calls (``model`` when eager)
        self.need = losses.needs(params)
        self.objective = objective or losses.OBJECTIVES.get(params.objective)
        self.view_maker = view_maker or augment.VIEW_MAKERS.get(params.views)
        # a method's own parameters (``extra``) reach the view maker too (e.g. ACL's aug_strength)
        self.base_view_kwargs = {**params.to_dict(), **params.extra_params()}
        self.view_kwargs = self.base_view_kwargs
        self.autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"
        )
        self.ctx: StepContext | None = None
        setup = self.objective.setup
        self.resources = setup(params, self.device) if setup is not None else {}
        if self.objective.contextual or self.objective.schedule is not None:
            self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Per-epoch state of an adversarial or scheduled objective (a no-op for the others).

        The attack's generator is derived from (seed, epoch) alone, like the view generator of the
        loop but a separate stream: resuming at an epoch boundary replays it bit for bit, and the
        views are the ones every other preset draws.
        """
        if not (self.objective.contextual or self.objective.schedule is not None):
            return
        values = (
            self.objective.schedule(self.params, epoch, self.cfg.epochs) if self.objective.schedule else {}
        )
        self.view_kwargs = {**self.base_view_kwargs, **values}
        gen = torch.Generator(device=self.device)
        gen.manual_seed((self.cfg.seed * 1_000_003 + epoch * 7_919 + 104_729) % (2**63))
        self.ctx = StepContext(
            epoch=epoch, epochs=self.cfg.epochs, gen=gen, values=values, resources=self.resources
        )

    def views(self, x: torch.Tensor, gen: torch.Generator) -> list[torch.Tensor]:
        """The batch's views, as the loss sees them (channels_last when configured)."""
        views = self.view_maker(x, self.need.n_views, gen, **self.view_kwargs)
        if self.cfg.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if self.compile.mode == "reduce-overhead":  # a new step: CUDA graphs may reuse the last one's memory
            torch.compiler.cudagraph_mark_step_begin()
        views = self.views(x, gen)
        with self.autocast:
            extra = {"ctx": self.ctx} if self.objective.contextual else {}
            loss, stats = self.objective.loss(
                self.net, views, y, self.params, gen, self.cfg.fuse_views, **extra
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), stats


def epoch_values(values: list[torch.Tensor | float]) -> list[float]:
    """Per-step values (0-dim tensors of one device, or floats) as Python floats, in one read-out."""
    if values and all(isinstance(v, torch.Tensor) for v in values):
        return torch.stack(values).tolist()  # type: ignore[arg-type]
    return [float(v) for v in values]


def check_finite(losses_: list[float], epoch: int) -> None:
    """:class:`NonFiniteLoss` naming the first step of ``epoch`` whose loss is not finite.

    Checked once per epoch, from the values read out at its end (a per-step check would make every
    step wait for the device): the weights of that epoch are never saved, as ``train`` saves its
    state only after this check.
    """
    for i, value in enumerate(losses_):
        if not math.isfinite(value):
            raise NonFiniteLoss(
                f"non-finite loss ({value}) at epoch {epoch} step {i + 1}; "
                "lower --lr or raise the temperature (--set t=...)"
            )
