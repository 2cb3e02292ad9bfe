"""The ++ post-processing of a pretrained robust encoder (DynACL++, DynACL-AIR++): pseudo-labels
by k-means on its features (:mod:`.pseudo_labels`), linear probing and adversarial finetuning on
them (:mod:`.lpaft`), a new checkpoint (:mod:`.run`); the recipes are :mod:`.recipes`.

``robustbench-nacl post CKPT --recipe dynacl++ --out DIR``; docs/decisions.md, 'The ++
post-processing', gives the authors' files and our readings.
"""

from .pseudo_labels import KMeansResult, assign_pseudo_labels, backbone_features, kmeans
from .recipes import POST_RECIPES, PostRecipe, resolve_recipe
from .run import post_process

__all__ = [
    "POST_RECIPES",
    "KMeansResult",
    "PostRecipe",
    "assign_pseudo_labels",
    "backbone_features",
    "kmeans",
    "post_process",
    "resolve_recipe",
]
