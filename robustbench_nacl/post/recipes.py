"""The ++ post-processing recipes (:data:`POST_RECIPES`): pseudo-labels by k-means on the
pretrained encoder's features, a linear probe on them (LP), then adversarial finetuning of the whole
model on them (AFT), as DynACL's and AIR's authors run it (docs/decisions.md, 'The ++
post-processing').

Every setting is a field of :class:`PostRecipe`; ``--set key=value`` overrides one, and the
resolved recipe (:meth:`PostRecipe.identity`) enters the output checkpoint's training
configuration, so that ``dynacl`` and its post-processed ``dynacl++`` are different recipes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..registry import Registry
from ..untrusted import MAX_FLOAT

#: where the attack of AFT starts: ``x`` itself (DynACL LPAFT.py's single-BN ``trades_loss``; AIR's
#: April-2023 ``trades_loss_dual``) or ``x + 0.001 N(0,1)`` (TRADES' own start; AIR's October-2023 one)
TRADES_STARTS = ("x", "randn")
#: the BatchNorm branches a recipe may name (models/dual_bn.py: clean = the authors' 'normal', adv = 'pgd')
ROUTES = ("clean", "adv")


@dataclass(frozen=True)
class PostRecipe:
    """One post-processing recipe; each field's comment gives the authors' setting it reads."""

    name: str
    source: str  # the authors' files and commit
    description: str
    # ---- pseudo-labels (assign_label.py / LP-AFF.py assign()) ----
    clusters: int | None = 10  # k of k-means; None: the dataset's number of classes
    kmeans_tol: float = 1e-4  # stop when (sum of centre shifts)^2 < tol (kmeans_pytorch default)
    kmeans_max_iter: int = 10_000  # a safety cap the authors lack (convergence comes far earlier)
    feature_route: str = "clean"  # BN branch of the features ('normal'), eval mode, unaugmented
    # ---- linear probing on pseudo-labels (train_head) ----
    lp_epochs: int = 10  # --epochs_head 10
    lp_lr: float = 0.01  # --lr_head 0.01
    lp_momentum: float = 0.9
    lp_weight_decay: float = 1e-4
    # ---- adversarial finetuning on pseudo-labels (train) ----
    aft_epochs: int = 25  # --epochs 25
    aft_lr: float = 0.1  # --lr 0.1
    aft_momentum: float = 0.9
    aft_weight_decay: float = 1e-4
    aft_milestones: str = "10,20"  # MultiStepLR milestones [10, 20]
    aft_gamma: float = 0.1
    batch_size: int = 512  # --batch_size 512, drop_last=True, both stages
    augment: str = "pad_crop_flip"  # RandomCrop(32, padding=4) + RandomHorizontalFlip, both stages
    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = 10  # perturb_steps=10
    beta: float = 6.0
    trades_start: str = "x"  # see TRADES_STARTS
    attack_target_route: str = "adv"  # branch of the attack's clean target p(x)
    train_route: str = "adv"  # branch of x and x_adv in the outer loss, and of the linear probe
    bn_momentum: float = 0.1  # both branches (the authors' nn.BatchNorm2d default)
    export_route: str = "adv"  # the exported encoder's evaluation branch (bnNameCnt=1)
    # the name the k-means seed derives from (default: ``name``); not a setting, so not in identity()
    seed_key: str = ""

    def check(self) -> None:
        """Raise a one-line ``UserError`` for a setting that cannot be run."""
        for k in ("lp_epochs", "aft_epochs", "batch_size", "steps", "kmeans_max_iter"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"post recipe {self.name}: {k} {v!r} must be an integer >= 1")
        if self.clusters is not None and (not isinstance(self.clusters, int) or self.clusters < 2):
            raise UserError(f"post recipe {self.name}: clusters {self.clusters!r} must be an integer >= 2")
        for k in ("kmeans_tol", "lp_lr", "aft_lr", "eps", "step_size", "aft_gamma", "bn_momentum"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and math.isfinite(v) and 0 < v <= MAX_FLOAT):
                raise UserError(f"post recipe {self.name}: {k} {v!r} must be a finite number > 0")
        for k in ("lp_momentum", "lp_weight_decay", "aft_momentum", "aft_weight_decay", "beta"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= MAX_FLOAT):
                raise UserError(f"post recipe {self.name}: {k} {v!r} must be a finite number >= 0")
        if self.trades_start not in TRADES_STARTS:
            raise UserError(
                f"post recipe {self.name}: trades_start {self.trades_start!r}: one of {TRADES_STARTS}"
            )
        for k in ("feature_route", "attack_target_route", "train_route", "export_route"):
            if getattr(self, k) not in ROUTES:
                raise UserError(f"post recipe {self.name}: {k} {getattr(self, k)!r}: one of {ROUTES}")
        self.milestones()
        from ..augment.views import VIEW_MAKERS

        VIEW_MAKERS.get(self.augment)  # an unknown view maker: one line now, not after the k-means

    def milestones(self) -> list[int]:
        """AFT's lr milestones as sorted epochs."""
        text = str(self.aft_milestones).strip()
        try:
            out = [int(p) for p in text.split(",")] if text else []
        except ValueError:
            raise UserError(
                f"post recipe {self.name}: aft_milestones {text!r}: a comma list of epochs"
            ) from None
        if any(m < 1 for m in out) or out != sorted(out):
            raise UserError(f"post recipe {self.name}: aft_milestones {text!r}: increasing epochs >= 1")
        return out

    def identity(self) -> dict[str, Any]:
        """What enters the output's training configuration: every setting but the prose."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in _PROSE[1:]}

    def kmeans_seed_key(self) -> str:
        """What the k-means seed derives from, with the parent's seed (``seed_key`` or the name)."""
        return self.seed_key or self.name


#: fields that are not settings: not overridable with --set, and but for the name not in identity()
_PROSE = ("name", "source", "description", "seed_key")


#: name -> recipe; ``robustbench-nacl post CKPT --recipe NAME``
POST_RECIPES: Registry[PostRecipe] = Registry("post-processing recipe")

POST_RECIPES.add(
    "dynacl++",
    PostRecipe(
        name="dynacl++",
        source="PKU-ML/DynACL@7d143db7 assign_label.py, LPAFT.py, utils.py trades_loss",
        description="DynACL++: k-means (10 clusters) pseudo-labels, LP 10 epochs, TRADES-AFT 25 "
        "epochs through the adversarial branch, attack starting at x itself",
    ),
)
POST_RECIPES.add(
    "air++",
    PostRecipe(
        name="air++",
        source="GodXuxilie/Enhancing_ACL_via_AIR@b28c1d67 LPAFT_AFF.py train(), utils.py trades_loss_dual"
        "(natural_mode='pgd'); pseudo-labels from --label_path (PKU-ML/DynACL@7d143db7 assign_label.py)",
        description="DynACL-AIR++ as AIR's April-2023 LPAFT_AFF.py runs it: DynACL's k-means pseudo-labels "
        "(10 clusters, tol 1e-4), LP, dual-BN TRADES-AFT with the attack's target, x_adv and the outer "
        "loss all through the adversarial branch, the attack starting at x itself",
    ),
)
#: the October-2023 LP-AFF.py (commit 2c9ad3d, unchanged at 15cf0a76), kept as a switch: the file as
#: committed cannot run (line 87: NameError on ``name``; line 583: ``return_features`` is no argument
#: of the model's forward), so no published number can have come from it (docs/decisions.md)
POST_RECIPES.add(
    "air++-2023-10",
    PostRecipe(
        name="air++-2023-10",
        source="GodXuxilie/Enhancing_ACL_via_AIR@2c9ad3d LP-AFF.py assign(), finetuning_utils.py "
        "trades_loss_dual (natural_mode='pgd'); the committed file cannot run",
        description="DynACL-AIR++ as AIR's October-2023 LP-AFF.py reads (a file that cannot run as "
        "committed): k-means one cluster per class (tol 1e-5), LP, dual-BN TRADES-AFT with the attack "
        "starting at x + 0.001 N(0,1) and its target through the clean branch",
        clusters=None,
        kmeans_tol=1e-5,
        trades_start="randn",
        attack_target_route="clean",
        seed_key="air++",  # the third edition's air++ draws: its published weights, made again
    ),
)


def resolve_recipe(name: str, overrides: dict[str, Any] | None = None) -> PostRecipe:
    """The registered recipe ``name`` with ``overrides`` (field -> value, strings coerced), checked."""
    base = POST_RECIPES.get(name)
    fields = {f.name: f for f in dataclasses.fields(PostRecipe)}
    changes: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if key not in fields or key in _PROSE:
            valid = [k for k in fields if k not in _PROSE]
            raise UserError(f"post recipe {name}: unknown setting {key!r}; valid: {', '.join(valid)}")
        changes[key] = _coerce(getattr(base, key), value, key)
    recipe = dataclasses.replace(base, **changes)
    recipe.check()
    return recipe


def _coerce(default: Any, value: Any, key: str) -> Any:
    """``value`` (a string from ``--set``, or already typed) as the type of the field's default."""
    if not isinstance(value, str) or isinstance(default, str):
        return value
    if key == "clusters" and value.lower() in ("none", "classes"):
        return None
    try:
        if isinstance(default, bool):
            return value.lower() in ("1", "true", "yes")
        if isinstance(default, int) or key == "clusters":
            return int(value)
        return float(value)
    except ValueError:
        raise UserError(f"post setting {key}={value!r}: not a number") from None
