"""Projection heads (the registry :data:`HEADS`, :func:`create_head`) and :class:`ContrastiveModel`,
an encoder with its head: what the contrastive loss sees; probing and attacks use the encoder alone.
Whether a head builds with or without class labels: :func:`head_builds`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import UserError
from ..registry import Registry
from .dual_bn import convert_to_dual_bn, has_dual_bn
from .encoders import Encoder, check_positive_int

HEADS: Registry[Callable[..., nn.Module]] = Registry("projection head")


@HEADS.register(
    "clae",
    description="Linear(d,512)-ReLU-Linear(512,64): CLAE/NaCl projection head",
    hidden=512,
    out_dim=64,
)
def clae_head(in_dim: int, hidden: int = 512, out_dim: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))


@HEADS.register(
    "simclr",
    description="Linear(d,512,no bias)-BN1d-ReLU-Linear(512,128): HCL/DCL projection head",
    hidden=512,
    out_dim=128,
)
def simclr_head(in_dim: int, hidden: int = 512, out_dim: int = 128) -> nn.Module:
    return nn.Sequential(
        nn.Linear(in_dim, hidden, bias=False),
        nn.BatchNorm1d(hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, out_dim, bias=True),
    )


@HEADS.register(
    "acl_mlp3_dualbn",
    description="Linear(d,d)-BN-ReLU-Linear(d,d,no bias)-BN-ReLU-Linear(d,d,no bias)-BN: ACL/DynACL "
    "proj_head (its BatchNorms dual when the encoder's are)",
    hidden=None,
    out_dim=None,
)
def acl_mlp3_head(in_dim: int, hidden: int | None = None, out_dim: int | None = None) -> nn.Module:
    # ACL/DynACL models/resnet_multi_bn.py proj_head(ch): every layer ch wide, a BatchNorm after each
    # of the three linear layers (the last one too), ReLU after the first two only
    hidden, out_dim = hidden or in_dim, out_dim or in_dim
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden, bias=False),
        nn.BatchNorm1d(hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, out_dim, bias=False),
        nn.BatchNorm1d(out_dim),
    )


@HEADS.register(
    "rocl_2048_128",
    description="Linear(d,2048)-ReLU-Linear(2048,128): RoCL projector",
    hidden=2048,
    out_dim=128,
)
def rocl_head(in_dim: int, hidden: int = 2048, out_dim: int = 128) -> nn.Module:
    # RoCL src/models/projector.py (Projector, expansion 1): no BatchNorm
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))


@HEADS.register("none", description="identity: the loss sees the encoder features", hidden=None, out_dim=None)
def identity_head(in_dim: int, hidden: int | None = None, out_dim: int | None = None) -> nn.Module:
    if hidden is not None or (out_dim is not None and out_dim != in_dim):
        raise UserError("projection head 'none' takes no hidden/out_dim options")
    return nn.Identity()


@HEADS.register(
    "linear",
    description="Linear(d, num_classes): the classifier of the supervised baseline (needs out_dim)",
    hidden=None,
    out_dim=None,
)
def linear_head(in_dim: int, hidden: int | None = None, out_dim: int | None = None) -> nn.Module:
    if out_dim is None:
        raise UserError("head 'linear' needs out_dim (the number of classes)")
    return nn.Linear(in_dim, out_dim)


def head_names() -> list[str]:
    """Registered projection-head names."""
    return HEADS.names()


def create_head(
    name: str,
    in_dim: int,
    *,
    hidden: int | None = None,
    out_dim: int | None = None,
    dual_bn: bool = False,
) -> nn.Module:
    """Build the registered projection head ``name`` on ``in_dim``-d features.

    ``hidden``/``out_dim`` default to the head's registered values (512/64 "clae", 512/128 "simclr").
    The returned module has an ``out_dim`` attribute. ``dual_bn`` converts its BatchNorms to
    :class:`DualBatchNorm`.
    """
    factory = HEADS.get(name)
    in_dim = check_positive_int(in_dim, "in_dim")
    kwargs: dict[str, int] = {}
    if hidden is not None:
        kwargs["hidden"] = check_positive_int(hidden, "hidden")
    if out_dim is not None:
        kwargs["out_dim"] = check_positive_int(out_dim, "out_dim")
    head = factory(in_dim, **kwargs)
    head.out_dim = kwargs.get("out_dim") or HEADS.info(name)["out_dim"] or in_dim
    if dual_bn:
        head = convert_to_dual_bn(head)
    return head


class ContrastiveModel(nn.Module):
    """Encoder plus projection head: ``forward(x) = head(encoder(x))``, not L2-normalised (the loss does it).

    ``head`` is a module or a registered head name; with a name, ``hidden``/``out_dim`` are passed to
    :func:`create_head`, and ``dual_bn=None`` gives the head dual BatchNorm exactly when the encoder has it.
    Probing and attacks use ``model.encoder`` alone (the projection head is discarded).
    """

    def __init__(
        self,
        encoder: Encoder,
        head: nn.Module | str = "clae",
        *,
        hidden: int | None = None,
        out_dim: int | None = None,
        dual_bn: bool | None = None,
    ) -> None:
        super().__init__()
        if isinstance(head, str):
            if dual_bn is None:
                dual_bn = has_dual_bn(encoder)
            head = create_head(head, encoder.feature_dim, hidden=hidden, out_dim=out_dim, dual_bn=dual_bn)
        elif hidden is not None or out_dim is not None or dual_bn is not None:
            raise TypeError("hidden/out_dim/dual_bn only apply when head is given by name")
        self.encoder = encoder
        self.head = head
        self.feature_dim = encoder.feature_dim
        self.out_dim = int(getattr(head, "out_dim", encoder.feature_dim))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder features h (what the probe and the attacks see)."""
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def head_builds(name: str, labels: bool) -> bool:
    """Whether the trainer could build head ``name``: with a class count exactly when labels are used.

    The trainer calls ``create_head(head, feature_dim, out_dim=num_classes if labels else None)``
    after loading the data; building it here on the meta device (no memory, no random draws) makes
    e.g. a classifier head under a contrastive objective fail before anything is loaded.
    """
    with torch.device("meta"):
        try:
            create_head(name, 8, out_dim=3 if labels else None)
        except UserError:
            return False
    return True
