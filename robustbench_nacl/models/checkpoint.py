"""Our checkpoint format: ``weights.safetensors`` plus a ``manifest.json`` sidecar.

Weights are safetensors (no code can run on load); the manifest says how to rebuild the module and
carries the weights' sha256, which is verified before anything is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from ..errors import CheckpointError, UserError, one_line
from ..io import sha256_bytes, sha256_file, write_bytes_atomic, write_json_atomic
from ..untrusted import read_regular, safe_name

WEIGHTS = "weights.safetensors"
MANIFEST = "manifest.json"
#: A manifest is a few kB: a larger file is no manifest (and is not read whole).
MAX_MANIFEST = 16 << 20


def save_weights(path: str | Path, module: nn.Module) -> str:
    """Write the module's state dict as safetensors, atomically; returns its sha256."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    data = st_save(state)
    write_bytes_atomic(path, data)
    return sha256_bytes(data)


def write_manifest(directory: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` last, so its presence marks a complete checkpoint."""
    write_json_atomic(Path(directory) / MANIFEST, manifest)


def resolve_manifest_path(path: str | Path) -> Path:
    """A checkpoint directory or its manifest.json -> the manifest path (CheckpointError if absent)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    if not p.is_file():
        raise CheckpointError(
            f"no checkpoint manifest at {p}; pass a directory written by `train` or its manifest.json"
        )
    return p


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Parse a manifest, with a one-line error for anything malformed."""
    p = resolve_manifest_path(path)
    try:
        manifest = json.loads(read_regular(p, "checkpoint manifest", MAX_MANIFEST))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON, UTF-8 or huge integers
        raise CheckpointError(f"{p} is not valid JSON ({one_line(e)}); the checkpoint is corrupt") from None
    except UserError as e:  # a FIFO, a device or an oversized file
        raise CheckpointError(str(e)) from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{p} must hold a JSON object")
    for key in ("encoder", "weights", "weights_sha256"):
        if key not in manifest:
            raise CheckpointError(f"{p} lacks the field {key!r}; was it written by `robustbench-nacl train`?")
    _check_manifest_types(manifest, p)
    return manifest


#: Manifest blocks that name another checkpoint (DeACL's teacher, a post-processed model's parent):
#: by id and sha256, never by the folder they lay in on the machine that used them.
PROVENANCE_BLOCKS = ("teacher", "parent")


def reference(block: Any) -> dict[str, Any] | None:
    """A provenance block (``teacher``, ``parent``) as what names that checkpoint anywhere: its id,
    loss and sha256s, without the local path it was read from (None if it is no block)."""
    if not isinstance(block, dict):
        return None
    return {k: v for k, v in block.items() if k != "checkpoint"}


def portable_loss_params(loss_params: Any, teacher: Any) -> Any:
    """``loss_params`` with a DeACL ``teacher`` path replaced by the teacher's id and sha256 (from the
    manifest's ``teacher`` block; its folder's name where there is none): what rows and published
    manifests record, so that no path of the machine that trained it leaves that machine."""
    extra = loss_params.get("extra") if isinstance(loss_params, dict) else None
    if not isinstance(extra, dict) or not isinstance(extra.get("teacher"), str):
        return loss_params
    ref = reference(teacher)
    named = (
        {"id": ref.get("id"), "weights_sha256": ref.get("weights_sha256")}
        if ref
        else {"id": Path(extra["teacher"]).name}
    )
    return {**loss_params, "extra": {**extra, "teacher": named}}


def portable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest fit to ship: its teacher and parent named by id and sha256 (:func:`reference`),
    in its provenance blocks, its ``loss_params`` and its ``config``'s overrides alike."""
    out = dict(manifest)
    for key in PROVENANCE_BLOCKS:
        if (ref := reference(out.get(key))) is not None:
            out[key] = ref
    out["loss_params"] = portable_loss_params(out.get("loss_params"), out.get("teacher"))
    config = out.get("config")
    if isinstance(config, dict) and isinstance(config.get("overrides"), dict):
        overrides = config["overrides"]
        if isinstance(overrides.get("teacher"), str):
            named = portable_loss_params({"extra": overrides}, out.get("teacher"))["extra"]
            out["config"] = {**config, "overrides": named}
    if "loss_params" not in manifest:
        del out["loss_params"]
    return out


def pinned_files(manifest: dict[str, Any]) -> dict[str, str]:
    """The files beside the weights that a manifest names with a sha256, name -> sha256: a
    post-processed checkpoint's pseudo-labels (``post.pseudo_labels``, which its manifest cites).
    A name that is not a plain file name of the folder (a path, a hidden file) is a CheckpointError."""
    post = manifest.get("post")
    if not isinstance(post, dict) or not post.get("pseudo_labels"):
        return {}
    name, sha = post["pseudo_labels"], post.get("pseudo_labels_sha256")
    if (
        not isinstance(name, str)
        or Path(name).name != name
        or name.startswith(".")
        or not isinstance(sha, str)
    ):
        raise CheckpointError(f"manifest field post.pseudo_labels {name!r} is not a file of the checkpoint")
    return {name: sha}


def pinned_file_problem(folder: Path, manifest: dict[str, Any]) -> str | None:
    """The first of :func:`pinned_files` that is missing from ``folder`` or differs from its pin, as
    one line (None when all match): what publishing refuses and what ``zoo verify`` reports."""
    for name, sha in pinned_files(manifest).items():
        if not (folder / name).is_file() or sha256_file(folder / name) != sha:
            return f"{folder / name}: missing or not the file its manifest pins"
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _check_manifest_types(manifest: dict[str, Any], p: Path) -> None:
    """The fields that rebuild the module must have the types ``train`` writes (the file may be hostile)."""

    def bad(field: str, what: str) -> CheckpointError:
        return CheckpointError(f"{p}: field {field!r} must be {what}; the manifest is corrupt or forged")

    if not isinstance(manifest["encoder"], str):
        raise bad("encoder", "an encoder name")
    for field, value in (("id", manifest.get("id")), ("post.pseudo_labels", _pseudo_labels(manifest))):
        # each names a file or folder somewhere (a card, a zoo folder, a file beside the weights)
        if value is not None:
            try:
                safe_name(value, f"{p}: field {field!r}")
            except UserError as e:
                raise CheckpointError(str(e)) from None
    weights = manifest["weights"]
    if not isinstance(weights, str) or not weights or len(weights) > 255:
        raise bad("weights", "a file name")
    if Path(weights).name != weights or weights in (".", "..") or "\\" in weights:
        # the weights lie beside the manifest; a path could name (or write, on download) any file
        raise bad("weights", f"a file name beside the manifest, not the path {weights[:60]!r}")
    sha = manifest["weights_sha256"]
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise bad("weights_sha256", "64 lowercase hex digits")
    if not isinstance(manifest.get("encoder_kwargs") or {}, dict):
        raise bad("encoder_kwargs", "a JSON object")
    if "in_channels" in manifest and (
        not isinstance(manifest["in_channels"], int) or isinstance(manifest["in_channels"], bool)
    ):
        raise bad("in_channels", "an integer")
    size = manifest.get("input_size")
    if size is not None and (
        not isinstance(size, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in size)
    ):
        raise bad("input_size", "a list of integers")
    norm = manifest.get("normalization")
    if norm is not None:
        if not isinstance(norm, dict):
            raise bad("normalization", "an object with mean and std")
        for k in ("mean", "std"):
            v = norm.get(k, [0.5])
            if not isinstance(v, list) or not v or not all(_is_number(x) for x in v):
                raise bad(f"normalization.{k}", "a non-empty list of numbers")


def _pseudo_labels(manifest: dict[str, Any]) -> Any:
    post = manifest.get("post")
    return post.get("pseudo_labels") or None if isinstance(post, dict) else None


def load_state(weights_path: str | Path, expected_sha256: str | None = None) -> dict[str, torch.Tensor]:
    """Read a safetensors file, verifying its sha256 and that every tensor is finite."""
    p = Path(weights_path)
    try:
        if not p.is_file():
            raise CheckpointError(f"weights file {p} not found")
        data = read_regular(p, "weights file")
    except OSError as e:
        raise CheckpointError(f"cannot read weights file {p}: {e.strerror or one_line(e)}") from None
    except UserError as e:  # a FIFO, a device or an oversized file
        raise CheckpointError(str(e)) from None
    if expected_sha256 is not None and sha256_bytes(data) != expected_sha256:
        raise CheckpointError(
            f"sha256 of {p} does not match its manifest (file changed or corrupt); refusing to load it"
        )
    try:
        state = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{p} is not a valid safetensors file ({str(e).splitlines()[0]})") from None
    check_finite(state, p)
    return state


def check_finite(state: dict[str, torch.Tensor], origin: Any) -> None:
    """Refuse weights holding NaN or Inf (they would silently poison every number downstream)."""
    for k, v in state.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise CheckpointError(
                f"{origin}: tensor {k!r} holds NaN or Inf values; the checkpoint is unusable"
            )


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], origin: Any) -> None:
    """``load_state_dict(strict=True)`` with a one-line error naming what did not match."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shape = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    # a float parameter given as integers (int32 weights) would be cast silently: no trained encoder
    # stores its weights so, so the file is refused (an integer buffer such as a BatchNorm counter is
    # integer in the module too, and passes)
    dtype = sorted(
        k for k in set(own) & set(state) if own[k].is_floating_point() and not state[k].is_floating_point()
    )
    if dtype:
        more = f" (+{len(dtype) - 3} more)" if len(dtype) > 3 else ""
        raise CheckpointError(
            f"{origin}: tensor(s) {', '.join(dtype[:3])}{more} are of dtype {state[dtype[0]].dtype}, not a "
            "floating-point type: these are no trained weights"
        )
    if missing or unexpected or shape:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shape)):
            if keys:
                more = f" (+{len(keys) - 5} more)" if len(keys) > 5 else ""
                parts.append(f"{label}: {', '.join(keys[:5])}{more}")
        raise CheckpointError(f"{origin} does not fit the architecture ({'; '.join(parts)}); check --arch")
    module.load_state_dict(state, strict=True)
