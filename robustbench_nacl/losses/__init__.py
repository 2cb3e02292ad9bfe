"""The contrastive-loss family: estimators, pure loss terms, objectives, named presets, plugin losses.

Modules import one way only: params -> estimators -> terms -> objectives -> adversarial -> presets
(each may import the ones before it, never the ones after).
"""

from .estimators import log_neg_mass, normalize, pair_loss, pair_loss_rows
from .objectives import (
    AGGREGATORS,
    OBJECTIVES,
    Objective,
    adversarial_view,
    contrastive_loss,
    encode,
    needs,
    objective,
    project,
)
from .params import ESTIMATORS, Estimate, LossParams, Needs, parse_overrides
from .presets import (
    PRESETS,
    VIEW_KEYS,
    Preset,
    apply_overrides,
    list_presets,
    register_pair_loss,
    register_preset,
    resolve,
    validate,
)
from .terms import arcl_rows, mixnca_rows, nca_rows, robust_rows, supervised_rows, var_rows, w_hat

__all__ = [
    "AGGREGATORS",
    "ESTIMATORS",
    "OBJECTIVES",
    "PRESETS",
    "VIEW_KEYS",
    "Estimate",
    "LossParams",
    "Needs",
    "Objective",
    "Preset",
    "adversarial_view",
    "apply_overrides",
    "arcl_rows",
    "contrastive_loss",
    "encode",
    "list_presets",
    "log_neg_mass",
    "mixnca_rows",
    "nca_rows",
    "needs",
    "normalize",
    "objective",
    "pair_loss",
    "pair_loss_rows",
    "parse_overrides",
    "project",
    "register_pair_loss",
    "register_preset",
    "resolve",
    "robust_rows",
    "supervised_rows",
    "validate",
    "var_rows",
    "w_hat",
]
