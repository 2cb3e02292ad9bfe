"""Threat models, attacks and attack suites.

Importing the package registers the built-in attacks, in the order every listing shows them:
``fgsm`` and ``fgsm_l2`` (:mod:`.fgsm`), ``pgd`` (:mod:`.pgd`), ``autoattack``
(:mod:`.autoattack_adapter`). A new attack is a module that registers itself in :data:`.base.ATTACKS`
and is imported here.
"""

# isort: off
from . import fgsm, pgd, autoattack_adapter  # noqa: F401  (registration order: the listing order)
# isort: on
