"""The contrastive-loss family: estimators, pure loss terms, objectives and named presets."""

from .estimators import ESTIMATORS, log_neg_mass, normalize, pair_loss, pair_loss_rows
from .objectives import AGGREGATORS, OBJECTIVES, adversarial_view, contrastive_loss, encode
from .presets import PRESETS, LossParams, Needs, Preset, list_presets, needs, parse_overrides, resolve
from .terms import arcl_rows, mixnca_rows, nca_rows, robust_rows, supervised_rows, var_rows, w_hat

__all__ = [
    "AGGREGATORS",
    "ESTIMATORS",
    "OBJECTIVES",
    "PRESETS",
    "LossParams",
    "Needs",
    "Preset",
    "adversarial_view",
    "arcl_rows",
    "contrastive_loss",
    "encode",
    "list_presets",
    "log_neg_mass",
    "mixnca_rows",
    "nca_rows",
    "needs",
    "normalize",
    "pair_loss",
    "pair_loss_rows",
    "parse_overrides",
    "resolve",
    "robust_rows",
    "supervised_rows",
    "var_rows",
    "w_hat",
]
