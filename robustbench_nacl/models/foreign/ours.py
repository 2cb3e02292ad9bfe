"""Our own checkpoints: the ``ours`` layout of a bare weights file, and the rebuild of a directory
written by ``train`` from its manifest (sha256 verified, dual BatchNorm and its evaluation route kept)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ...errors import CheckpointError, UserError
from ..checkpoint import MANIFEST, load_state, load_strict, read_manifest
from ..dual_bn import set_bn_route, strip_dual_bn
from ..factory import create_encoder
from .layout import Layout, has_prefix
from .normalization import named_normalization, normalization_name
from .reading import first_line

# ContrastiveModel (encoder.backbone.*, encoder.mean/std, head.*) or a bare Encoder


def _ours_prefix(state: Mapping[str, Tensor]) -> str | None:
    if has_prefix(state, "encoder.backbone."):
        return "encoder."
    if has_prefix(state, "backbone.") and "mean" in state and "std" in state:
        return ""
    return None


def _ours_convert(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    prefix = _ours_prefix(state) or ""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key.startswith(prefix + "backbone."):
            out[key[len(prefix + "backbone.") :]] = value
        elif key in (prefix + "mean", prefix + "std") or key.startswith("head."):
            continue  # normalisation is read separately; the projection head is not evaluated
        else:
            out[key] = value  # left as is, so the strict load reports it
    # a dual-BN encoder is evaluated through its clean branch (its default route)
    return strip_dual_bn(out)


def _ours_normalization(state: Mapping[str, Tensor]) -> tuple[list[float], list[float]] | None:
    prefix = _ours_prefix(state) or ""
    mean, std = state.get(prefix + "mean"), state.get(prefix + "std")
    if mean is None or std is None:
        return None
    return mean.flatten().tolist(), std.flatten().tolist()


LAYOUTS = (
    (
        Layout("ours", lambda s: _ours_prefix(s) is not None, _ours_convert, _ours_normalization),
        "weights.safetensors of our trainer: encoder.backbone.*, encoder.mean/std (dual BN -> clean branch)",
    ),
)


def load_ours(
    manifest_path: Path, *, arch: str | None, fmt: str, normalize: str | None
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild an encoder from a checkpoint written by ``train`` (manifest + verified safetensors)."""
    manifest = read_manifest(manifest_path)
    origin = manifest_path.parent
    if fmt not in ("auto", "ours"):
        raise UserError(f"{origin} is a checkpoint written by `train`; --format {fmt} does not apply to it")
    name = manifest["encoder"]
    if arch is not None and arch != name:
        raise CheckpointError(f"{origin} holds a {name} encoder, not --arch {arch}; omit --arch for it")
    norm = manifest.get("normalization") or {}
    mean, std = norm.get("mean", (0.5,)), norm.get("std", (0.5,))
    if normalize is not None and normalization_name(mean, std) != normalize:
        named_normalization(normalize)  # an unknown name gets the list of valid ones
        raise UserError(
            f"{origin} was trained with normalisation mean={list(mean)} std={list(std)}; "
            f"--normalize {normalize} does not apply to it (omit --normalize)"
        )
    weights = str(manifest["weights"])
    if Path(weights).name != weights or weights in ("", ".", ".."):
        # the manifest names a file beside it; anything else could point anywhere on disk
        raise CheckpointError(f"{manifest_path}: weights {weights!r} must be a file name in {origin}")
    weights_path = origin / weights
    state = load_state(weights_path, expected_sha256=manifest["weights_sha256"])
    in_channels = manifest.get("in_channels", 3)
    size = manifest.get("input_size")
    try:
        input_shape = (int(in_channels), *(int(s) for s in size)) if size else None
        encoder = create_encoder(
            name,
            in_channels=int(in_channels),
            mean=mean,
            std=std,
            dual_bn=bool(manifest.get("dual_bn", False)),
            input_shape=input_shape,  # type: ignore[arg-type]
            **dict(manifest.get("encoder_kwargs") or {}),
        )
    except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: a forged size that cannot be allocated
        raise CheckpointError(f"{manifest_path} has malformed encoder fields ({first_line(e)})") from None
    # the projection head is not evaluated; the encoder (buffers included) must match exactly
    enc_state = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    load_strict(encoder, enc_state, weights_path)
    # a dual-BN encoder stays dual: evaluation uses the clean branch unless the manifest names
    # another (ACL/DynACL checkpoints: the adversarial branch, as their authors evaluate them)
    route = manifest.get("eval_bn_route", "clean")
    if route not in ("clean", "adv"):
        raise CheckpointError(f"{manifest_path}: eval_bn_route {route!r} must be 'clean' or 'adv'")
    set_bn_route(encoder, route)
    encoder.eval()
    info = {
        **manifest,
        "checkpoint_id": manifest.get("id"),
        "sha256": manifest["weights_sha256"],
        "format": "ours",
        "arch": name,
        "normalize": normalization_name(encoder.mean.flatten().tolist(), encoder.std.flatten().tolist())
        or "manifest",
        "path": str(weights_path),
        "manifest_path": str(manifest_path),
        "n_tensors": len(state),
    }
    return encoder, info


def sibling_manifest(path: Path) -> Path | None:
    """The manifest.json beside a weights file that it describes (so ``run/weights.safetensors`` works)."""
    candidate = path.parent / MANIFEST
    if not path.is_file() or not candidate.is_file():
        return None
    try:
        manifest = json.loads(candidate.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return candidate if isinstance(manifest, dict) and manifest.get("weights") == path.name else None
