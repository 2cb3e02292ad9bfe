"""Loading encoders for evaluation: our own checkpoints and foreign ResNet state dicts.

Modules: ``reading`` (safe file reading), ``layout`` (what a layout is), one module per layout
family (``ours``, ``lightly``, ``solo``, ``plain``), ``formats`` (the registry, detection,
conversion), ``normalization`` and ``load`` (the entry points).

:func:`load_encoder` is the one entry point. A directory written by ``train`` (or its manifest.json)
is rebuilt from its manifest; any other file is a *foreign* checkpoint, read by
:func:`load_foreign_encoder` into one of our registered encoders (``--arch``).

Foreign files come in several key layouts (:data:`FORMATS`), all converted to torchvision's ResNet
layout, which is exactly the layout of ``Encoder.backbone`` (see :mod:`robustbench_nacl.models.encoders`):

* ``torchvision``: ``conv1.weight``, ``layer1.0.conv1.weight``, ... (``fc.*`` dropped);
* ``lightly``: lightly's recipe ``nn.Sequential(*list(torchvision.models.resnetN().children())[:-1])``
  (``0`` conv1, ``1`` bn1, ``4``-``7`` layer1-4), bare or as ``backbone.*`` of a LightningModule
  checkpoint (heads and momentum copies dropped);
* ``solo-learn``: a Lightning checkpoint whose ``state_dict`` has ``backbone.*`` (``encoder.*`` in
  old versions) plus heads, momentum copies and queues (everything else dropped). Its CIFAR ResNet
  pads the 3x3 conv1 by 2, not 1: the stem is read from solo-learn's ``args.json`` beside the file
  (see :func:`read_solo_args` and docs/decisions.md, 'Foreign checkpoints');
* ``hcl``: the HCL/DCL code's ``f`` Sequential of resnet children without maxpool and fc
  (``f.0`` conv1, ``f.1`` bn1, ``f.3``-``f.6`` layer1-4; the ``g.*`` projection head dropped);
* ``ours``: the safetensors written by our trainer (``encoder.backbone.*``; dual BN reduced to its
  clean branch), whose ``encoder.mean``/``encoder.std`` also give the normalisation;
* ``timm`` (``--arch timm:NAME`` only): timm's own names, classifier dropped;
* ``prefixed`` (never detected): ``backbone.*`` of any other library, loaded into ``--arch`` as built.

Wrapper prefixes shared by every key (``module.`` from DataParallel, ``model.``, ``encoder.``) are
stripped first. Loading is strict: every converted key must be used and every backbone key present
with the right shape.

Safety (see docs/decisions.md, "Loading untrusted checkpoints"): safetensors is preferred (no code
can run); pickles are read with ``torch.load(..., weights_only=True)`` passed explicitly, after
refusing the environment override that would re-enable full unpickling, and a file that needs more
than tensors is refused, naming the offending globals (found by static disassembly, which executes
nothing). A file of no checkpoint format (text, empty, compressed) is named for what it is first.
"""

from .formats import FORMATS, convert_state_dict, detect_format
from .layout import Layout
from .load import load_encoder, load_foreign_encoder
from .normalization import NORMALIZATIONS
from .reading import describe_file, read_state_dict
from .solo import SOLO_NORMALIZATIONS, SoloRun, read_solo_args

__all__ = [
    "FORMATS",
    "NORMALIZATIONS",
    "SOLO_NORMALIZATIONS",
    "Layout",
    "SoloRun",
    "convert_state_dict",
    "describe_file",
    "detect_format",
    "load_encoder",
    "load_foreign_encoder",
    "read_solo_args",
    "read_state_dict",
]
