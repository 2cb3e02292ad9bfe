"""Fitted linear probes ("heads") saved beside the rows they produced, and reused instead of refitting.

A head is addressed by what determines it: the encoder's weights (sha256), the setting, the
dataset and the probe configuration with its seed, the same fields that enter every row's
identity. Published reference models ship their heads, so ``eval --model NAME`` attacks exactly
the classifier the committed rows attacked (a refitted probe drifts with another CPU's rounding).
Files are safetensors; the probe's report (accuracies, sizes, config) rides in the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as st_save
from torch import nn

from ..errors import UserError
from ..io import canonical_json, sha256_bytes, write_bytes_atomic
from .probe import ProbeResult

HEADS_DIR = "heads"


#: Settings that attack another setting's probe: a corruption setting attacks the in-domain head on
#: corrupted test images (the same probe, fitted once), so it has no head of its own.
PROBED_AS = {"corruption": "in-domain"}


def head_key(checkpoint_sha256: str, setting: str, dataset: str, probe_config: dict[str, Any]) -> str:
    """The content address of a head: a hash of everything that determines its weights (a corruption
    row's head is its in-domain head: :data:`PROBED_AS`)."""
    setting = PROBED_AS.get(setting, setting)
    ident = {"checkpoint_sha256": checkpoint_sha256, "setting": setting, "dataset": dataset}
    return sha256_bytes(canonical_json({**ident, "probe_config": probe_config}).encode())[:24]


def head_path(folder: str | Path, key: str) -> Path:
    """Where a head lives under a heads folder."""
    return Path(folder) / f"{key}.safetensors"


def save_head(folder: str | Path, key: str, head: nn.Linear, result: ProbeResult) -> Path:
    """Write a fitted head and its probe report atomically; returns the file."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    # one metadata entry: safetensors writes a metadata dict in hash order, so two keys would make the
    # same head two different files from run to run (the bytes of a resumed run must equal a fresh one)
    meta = {"head": canonical_json({"key": key, "probe_result": result.to_dict()})}
    path = head_path(folder, key)
    write_bytes_atomic(path, st_save(tensors, metadata=meta))
    return path


def load_head(folder: str | Path, key: str) -> tuple[nn.Linear, ProbeResult] | None:
    """The head stored under ``key`` (None when there is none); a damaged file is a one-line error."""
    path = head_path(folder, key)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            weight, bias = f.get_tensor("weight"), f.get_tensor("bias")
        if "head" in meta:  # the current layout; heads written before it carry the two fields apart
            meta = json.loads(meta["head"])
        else:
            meta = {"key": meta["key"], "probe_result": json.loads(meta["probe_result"])}
        result = ProbeResult(**meta["probe_result"])
    except (SafetensorError, KeyError, TypeError, ValueError) as e:
        raise UserError(
            f"linear head {path} is damaged ({' '.join(str(e).split())[:120]}); delete it to refit the probe"
        ) from None
    if meta.get("key") != key or weight.ndim != 2 or bias.shape != weight.shape[:1]:
        raise UserError(f"linear head {path} does not hold the head {key}; delete it to refit the probe")
    head = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    return head, result
