"""Adversarial contrastive pretraining: the shared engine (``engine``) and one module per method
(``acl``, ``dynacl``, ``rocl``, ``deacl``, ``air``), each registering its objective on import.

Adding a method is one new module here that calls ``engine.register_adversarial_objective`` and
one preset in ``losses/presets.py``; readings and sources: docs/decisions.md, 'Adversarial
contrastive pretraining'.
"""

from .acl import ACL_ATTACK, ACL_MODES, acl_loss
from .air import AIR_DEFAULTS, air_regularisers, air_schedule
from .deacl import DEACL_ATTACK, deacl_loss, load_teacher
from .dynacl import dynacl_schedule, momentum_update
from .engine import InnerAttack, StepContext, multi_view_nt_xent, nt_xent, pgd_maximise
from .rocl import ROCL_ATTACK, rocl_loss

__all__ = [
    "ACL_ATTACK",
    "ACL_MODES",
    "AIR_DEFAULTS",
    "DEACL_ATTACK",
    "ROCL_ATTACK",
    "InnerAttack",
    "StepContext",
    "acl_loss",
    "air_regularisers",
    "air_schedule",
    "deacl_loss",
    "dynacl_schedule",
    "load_teacher",
    "momentum_update",
    "multi_view_nt_xent",
    "nt_xent",
    "pgd_maximise",
    "rocl_loss",
]
