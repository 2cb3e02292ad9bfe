"""The label-free protocol (``--protocol label-free``): the frozen encoder's representation attacked
directly, read without a head (docs/decisions.md, 'Label-free robustness').

For each eps of :class:`~robustbench_nacl.results.label_free.LabelFreeConfig`, on the first n test
images (the same examples as every other protocol's rows, so rows pair across recipes):

- ``repr_pgd_cos`` / ``repr_pgd_l2``: untargeted sign-PGD away from the clean embedding (layer6's
  cosine and L2 objectives). Per example: the cosine between attacked and clean embedding, their L2
  distance over the median clean distance and as a universal quantile (Petrov et al.), and the
  breakaway risk: the fraction of the *other* clean embeddings of the bank now closer to the attacked
  embedding than its own clean one is (``breakaway.py``). Robust: none is (the attacked embedding
  still retrieves its own image).
- ``impersonation``: targeted sign-PGD (L2) toward a partner's clean embedding (a seeded random
  pairing of the examples); broken when the attacked embedding's nearest neighbour in the clean bank
  is the partner.
- ``margin``: Petrov et al.'s adversarial margin of each pair from the same targeted attacks,
  ``(d(x, x'->x) - d(x, x->x')) / d(x, x')``; robust when >= 0 (no overlap).
- ``knn_repr_cos`` / ``knn_repr_l2`` (labelled data only): the weighted kNN classifier of the probe
  settings (training split as the bank) on the untargeted attacks' embeddings: a label-free attack
  read through a label-using read-out.

The clean bank is every test image of the setting (all of an image folder); the distance
distribution of the universal quantiles is computed from those *clean* embeddings alone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attack.representation import (
    OBJECTIVES,
    clean_median,
    clean_quantiles,
    embed,
    input_gradient,
    representation_pgd,
    universal_quantile,
)
from ..attack.rng import derive_seed, rand
from ..errors import UserError
from ..io import check_writable_dir, sha256_bytes
from ..locks import advisory_lock, remove_temporaries
from ..models.features import extract_features, knn_predict
from ..results import rows as results
from ..results.eps import eps_label
from ..results.label_free import (
    ATTACKS,
    FOLDER_PREFIX,
    LabelFreeConfig,
    attack_params,
    encode_values,
    identities,
)
from ..results.rows import ResultRow
from ..utils import device_name, versions
from .probe import ProbeConfig

__all__ = [
    "FLAGS",
    "LabelFreeData",
    "attack_versions",
    "image_folder",
    "load_image_folder",
    "measure",
    "run_label_free",
]

#: the protocol's sanity flags (``sanity_<name>`` in each row, False when it fires)
FLAGS: dict[str, str] = {
    "deterministic": "two forwards of the same images disagree: a randomized encoder",
    "nonzero_gradients": "some examples have an all-zero input gradient of the L2 objective (masked)",
    "unbounded_moves_embedding": "an attack at eps = 1 does not move the embedding beyond its random start",
}
# The unbounded attack must move the embedding further than its random start did on at least this
# fraction of the sanity examples (zero or masked gradients leave every one at its start: 0 %)
UNBOUNDED_MIN_FRAC = 0.9
UNBOUNDED_EPS = 1.0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


@dataclass(frozen=True)
class LabelFreeData:
    """What the protocol reads: the test images (uint8, the bank; the first ``n`` attacked) and, for
    the kNN read-outs, the labels of the test images and the training split (None for a folder)."""

    dataset: str
    x: Tensor
    y: Tensor | None = None
    x_train: Tensor | None = None
    y_train: Tensor | None = None
    num_classes: int | None = None

    @property
    def labelled(self) -> bool:
        return self.y is not None and self.x_train is not None


# ============ an unlabeled image folder ============


def image_folder(dataset: Any) -> Path | None:
    """The folder ``dataset`` names, if it is an existing directory (else None: a dataset spec)."""
    if not isinstance(dataset, (str, Path)):
        return None
    p = Path(str(dataset)).expanduser()
    return p if p.is_dir() else None


def load_image_folder(folder: Path, channels: int | None, size: int | None) -> tuple[str, Tensor]:
    """(dataset string, uint8 images (N, C, H, W)) of every image file under ``folder`` (sorted by
    path; labels, subfolder names included, are ignored). Images are converted to ``channels`` (1:
    greyscale, 3: RGB) and resized to ``size`` (bilinear), the encoder's input; where unknown, those
    of the first image. The string names the folder and the sha256 of the decoded images."""
    from PIL import Image, UnidentifiedImageError

    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if len(files) < 2:
        raise UserError(f"{folder}: an image folder needs at least 2 images ({', '.join(IMAGE_SUFFIXES)})")
    arrays = []
    for f in files:
        try:
            with Image.open(f) as im:
                if channels is None:
                    channels = 1 if im.mode in ("1", "L", "I", "I;16", "F") else 3
                im = im.convert("L" if channels == 1 else "RGB")
                if size is None:
                    size = im.size[0]
                if im.size != (size, size):
                    im = im.resize((size, size), Image.BILINEAR)
                a = np.asarray(im, dtype=np.uint8)
        except (OSError, UnidentifiedImageError) as e:
            raise UserError(f"{f}: not a readable image ({' '.join(str(e).split())[:120]})") from None
        arrays.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    x = torch.from_numpy(np.stack(arrays))
    sha = sha256_bytes(str(tuple(x.shape)).encode() + x.numpy().tobytes())
    return f"{FOLDER_PREFIX}{folder.name}@{sha[:12]}", x


# ============ the measurement ============


def _gen(seed: int, *parts: Any) -> torch.Generator:
    """A CPU generator for one draw of the protocol, from the run's seed and what the draw is for."""
    return torch.Generator().manual_seed(derive_seed(seed, "label-free", *parts))


def _pairs(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(partner of each example, origin of the attack toward each example): a seeded random pairing
    (Petrov et al. attack disjoint random pairs); with an odd n the last example's partner is the
    first of the permutation, whose attack toward it is then an extra one."""
    if n < 2:
        raise UserError("label-free: impersonation and margin need at least 2 examples (--n-examples)")
    perm = torch.randperm(n, generator=gen)
    partner = torch.empty(n, dtype=torch.long)
    for a, b in zip(perm[0::2].tolist(), perm[1::2].tolist(), strict=False):
        partner[a], partner[b] = b, a
    if n % 2:
        partner[int(perm[-1])] = int(perm[0])
    return partner, perm


def _closer_than_self(z_adv: Tensor, bank: Tensor, own: Tensor) -> Tensor:
    """Per attacked embedding: how many bank embeddings other than its own clean one (index ``own``)
    are strictly closer to it than that one is (Petrov et al.'s ``too_close_mask``, row sums)."""
    d = torch.cdist(z_adv, bank, compute_mode="donot_use_mm_for_euclid_dist")
    rows = torch.arange(len(z_adv))
    mask = d < d[rows, own][:, None]
    mask[rows, own] = False
    return mask.sum(dim=1)


def _nearest(z: Tensor, bank: Tensor) -> Tensor:
    """Index of each embedding's nearest bank embedding (L2; the first on a tie)."""
    return torch.cdist(z, bank, compute_mode="donot_use_mm_for_euclid_dist").argmin(dim=1)


def _knn(data: LabelFreeData, encoder: nn.Module, probe: ProbeConfig, device: torch.device) -> Any:
    """A function: embeddings -> weighted-kNN predictions on the training split (the probe's k, t and
    ``max_train``), or None without labels."""
    if not data.labelled:
        return None
    assert data.x_train is not None and data.y_train is not None and data.num_classes is not None
    m = probe.max_train
    bank = extract_features(encoder, data.x_train[:m], device=device, keep_device=True)
    y = data.y_train[:m].to(device)
    k, t, c = probe.knn_k, probe.knn_t, data.num_classes
    return lambda q: knn_predict(bank, y, q, num_classes=c, k=k, t=t).cpu()


def _sanity(encoder: nn.Module, x: Tensor, cfg: LabelFreeConfig, seed: int, batch: int) -> dict[str, Any]:
    """The protocol's flags on the first ``cfg.sanity_n`` examples (:data:`FLAGS`)."""
    xs = x[: cfg.sanity_n]
    z = embed(encoder, xs, batch)
    deterministic = bool(torch.allclose(z, embed(encoder, xs, batch), rtol=1e-5, atol=1e-6))
    start = (rand(xs, _gen(seed, "sanity-start")) * 2 - 1) * UNBOUNDED_EPS
    # the L2 objective's input gradient at the random start (at the clean image it is 0 by design)
    xg = (xs + start).clamp(0, 1).requires_grad_(True)
    g = input_gradient(OBJECTIVES.get("l2")(encoder(xg).float(), z).sum(), xg)
    zero_frac = float((g.flatten(1).abs().amax(dim=1) == 0).float().mean())
    z_start = embed(encoder, (xs + start).clamp(0, 1), batch)
    moved = []
    for name in ("cos", "l2"):
        fn = OBJECTIVES.get(name)
        adv = representation_pgd(
            encoder, xs, eps=UNBOUNDED_EPS, step_size=cfg.step(UNBOUNDED_EPS), steps=cfg.steps,
            objective=name, init=start, batch_size=batch,
        )  # fmt: skip
        z_adv = embed(encoder, adv, batch)
        # further from the clean embedding than the start was, by the attack's own objective
        moved.append(float((fn(z_adv, z) > fn(z_start, z) + 1e-6 * fn(z_start, z).abs()).float().mean()))
    frac = min(moved)
    return {
        "sanity_deterministic": deterministic,
        "sanity_nonzero_gradients": zero_frac == 0.0,
        "sanity_zero_grad_frac": zero_frac,
        "sanity_unbounded_moves_embedding": frac >= UNBOUNDED_MIN_FRAC,
        "sanity_unbounded_moved_frac": frac,
    }


def measure(
    encoder: nn.Module,
    data: LabelFreeData,
    cfg: LabelFreeConfig,
    *,
    seed: int,
    n_examples: int | None,
    probe: ProbeConfig,
    device: torch.device,
    batch_size: int | None = None,
) -> list[dict[str, Any]]:
    """The measured fields of every row (without the checkpoint fields), in :func:`identities`' order."""
    batch = batch_size or 256
    bank_x = data.x.to(device).float().div(255)
    x = bank_x[:n_examples]
    n = len(x)
    if n < 2:
        raise UserError("label-free: at least 2 examples are needed (--n-examples)")
    bank = embed(encoder, bank_x, batch)
    z = bank[:n]
    quantiles = clean_quantiles(bank, _gen(seed, data.dataset, "quantiles"), cfg.quantile_batch)
    median = clean_median(quantiles)
    own = torch.arange(n, device=bank.device)
    knn = _knn(data, encoder, probe, device)
    y = data.y[:n].cpu() if data.y is not None else None
    knn_clean = (knn(z) == y) if knn is not None else None
    partner, _ = _pairs(n, _gen(seed, data.dataset, "pairs"))
    partner = partner.to(device)
    origin = torch.nonzero(partner[partner] != own).flatten()  # whose reverse attack is not a partner's
    flags = _sanity(encoder, x, cfg, seed, batch)
    out: list[dict[str, Any]] = []
    for eps in cfg.eps_values():
        t0 = time.perf_counter()
        step = cfg.step(eps)
        common = {"eps": eps, "step": step}
        adv_z: dict[str, Tensor] = {}
        for name in ("cos", "l2"):
            adv = representation_pgd(
                encoder, x, eps=eps, step_size=step, steps=cfg.steps, objective=name,
                gen=_gen(seed, data.dataset, "untargeted", name, eps), batch_size=batch,
            )  # fmt: skip
            adv_z[name] = embed(encoder, adv, batch)
        z_to, z_back = _targeted(encoder, x, z, (partner, origin), cfg, eps, (seed, data.dataset), batch)
        spent = time.perf_counter() - t0
        for name in ("cos", "l2"):
            za = adv_z[name]
            closer = _closer_than_self(za, bank, own).cpu()
            clean_closer = _closer_than_self(z, bank, own).cpu()
            dist = (za - z).norm(dim=1).cpu()
            values = {
                "cos": F.cosine_similarity(za, z, dim=1).cpu(),
                "dist": dist / median,
                "uq": torch.from_numpy(universal_quantile(dist, quantiles)),
                "breakaway": closer.double() / (len(bank) - 1),
            }
            keep = ("cos", "dist") if name == "cos" else ("dist", "uq", "breakaway")
            kept, clean_kept = closer == 0, clean_closer == 0
            out.append(_fields(f"repr_pgd_{name}", common, clean_kept, kept, values, keep, spent, flags))
        nearest = _nearest(z_to, bank)
        success = (nearest == partner).cpu()
        clean_hit = (_nearest(z, bank) == partner).cpu()
        d_pair = (z - z[partner]).norm(dim=1)
        # a pair whose clean embeddings coincide has no ratio: NaN (not robust: they already overlap;
        # skipped by the measure's mean), never +-inf
        margin = ((z - z_back).norm(dim=1) - (z - z_to).norm(dim=1)) / d_pair
        margin = torch.where(d_pair > 0, margin, torch.full_like(margin, float("nan")))
        values = {"dist": ((z_to - z[partner]).norm(dim=1) / median).cpu(), "margin": margin.cpu()}
        out.append(_fields("impersonation", common, ~clean_hit, ~success, values, ("dist",), spent, flags))
        ones = torch.ones(n, dtype=torch.bool)
        out.append(_fields("margin", common, ones, (margin >= 0).cpu(), values, ("margin",), spent, flags))
        if knn_clean is not None:
            for name in ("cos", "l2"):
                hit = knn(adv_z[name]) == y
                out.append(_fields(f"knn_repr_{name}", common, knn_clean, hit, {}, (), spent, flags))
    return out


def _targeted(
    encoder: nn.Module,
    x: Tensor,
    z: Tensor,
    pairs: tuple[Tensor, Tensor],
    cfg: LabelFreeConfig,
    eps: float,
    seed_of: tuple[int, str],
    batch: int,
) -> tuple[Tensor, Tensor]:
    """The targeted attacks at ``eps``: each x_i toward its partner's clean embedding (``z_to``), and
    each pair's reverse (``z_back``: the partner's attack toward i), attacked anew for the examples
    whose partner's partner is not them (``pairs``: partner, those origins)."""
    partner, origin = pairs
    seed, dataset = seed_of
    step = cfg.step(eps)
    toward = representation_pgd(
        encoder, x, eps=eps, step_size=step, steps=cfg.steps, objective="l2", target=z[partner],
        gen=_gen(seed, dataset, "targeted", eps), batch_size=batch,
    )  # fmt: skip
    z_to = embed(encoder, toward, batch)
    z_back = z_to[partner].clone()  # the partner's attack toward i (the pair's reverse)
    if len(origin):
        src = partner[origin]
        extra = representation_pgd(
            encoder, x[src], eps=eps, step_size=step, steps=cfg.steps, objective="l2",
            target=z[origin], gen=_gen(seed, dataset, "targeted-extra", eps), batch_size=batch,
        )  # fmt: skip
        z_back[origin] = embed(encoder, extra, batch)
    return z_to, z_back


def _fields(
    attack: str,
    common: dict[str, Any],
    clean: Tensor,
    robust: Tensor,
    values: dict[str, Tensor],
    keep: tuple[str, ...],
    spent: float,
    flags: dict[str, Any],
) -> dict[str, Any]:
    """One row's measured fields: an example counts as robust only if it was clean-correct too."""
    from ..results.bits import encode_bits

    clean, robust = clean.bool().cpu(), robust.bool().cpu() & clean.bool().cpu()
    n = len(clean)
    failed = [k.removeprefix("sanity_") for k, v in flags.items() if v is False]
    return {
        "attack": attack,
        "eps": common["eps"],
        "clean_acc": float(clean.float().mean()),
        "robust_acc": float(robust.float().mean()),
        "n_clean": int(clean.sum()),
        "n_robust": int(robust.sum()),
        "n_examples_evaluated": n,
        "clean_bits": encode_bits(clean),
        "robust_bits": encode_bits(robust),
        "per_example": {k: encode_values(values[k].numpy()) for k in keep},
        "attack_wall_s": round(spent, 3),
        **flags,
        "sanity_ok": not failed,
        "sanity_failed": ",".join(failed),
    }


# ============ rows: reuse what exists, compute the rest, write ============


def attack_versions() -> dict[str, str]:
    """The rows' ``attack_versions``: the attacks are this package's code alone."""
    return {"robustbench_nacl": str(versions()["robustbench_nacl"])}


def run_label_free(
    encoder: nn.Module,
    data: LabelFreeData,
    cfg: LabelFreeConfig,
    *,
    base: dict[str, Any],
    seed: int,
    n_examples: int | None,
    probe: ProbeConfig,
    out: Path,
    force: bool,
    device: torch.device,
    batch_size: int | None = None,
    device_class: str | None = None,
) -> tuple[list[ResultRow], int]:
    """The label-free rows of one encoder on ``data`` (reused where on disk, else computed and
    written under the advisory lock of its rows), and how many were computed."""
    cfg.check()
    probe = probe if probe.seed is not None else dataclasses.replace(probe, seed=seed)
    versions_of = attack_versions()
    planned = identities(
        cfg, dataset=data.dataset, checkpoint_sha256=base["checkpoint_sha256"], seed=seed,
        n_examples=n_examples, probe_config=probe.as_dict(), attack_versions=versions_of,
        labelled=data.labelled, device_class=device_class,
    )  # fmt: skip
    ids = [results.row_id(i) for i in planned]

    def existing() -> dict[str, ResultRow]:
        if force:
            return {}
        found = {r: results.read_valid_row(results.row_path(out, r), r) for r in ids}
        return {r: row for r, row in found.items() if row is not None}

    done = existing()
    if len(done) == len(ids):
        return [done[r] for r in ids], 0
    check_writable_dir(out / results.ROWS_DIR)
    key = hashlib.sha256(" ".join(sorted(ids)).encode()).hexdigest()[:24]
    with advisory_lock(out, key, f"{base['checkpoint_id']} label-free {data.dataset}"):
        done = existing()
        remove_temporaries(out / results.ROWS_DIR, [f"{r}.json" for r in ids])
        if len(done) == len(ids):
            return [done[r] for r in ids], 0
        t0 = time.perf_counter()
        measured = measure(
            encoder, data, cfg, seed=seed, n_examples=n_examples, probe=probe, device=device,
            batch_size=batch_size,
        )  # fmt: skip
        shared = {
            "versions": versions(),
            "device": device_name(device),
            "label_free_wall_s": round(time.perf_counter() - t0, 3),
            "n_bank": len(data.x),
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        rows = []
        for ident, m in zip(planned, measured, strict=True):
            if m["attack"] != ident["attack"] or m["eps"] != ident["eps"]:
                raise RuntimeError(f"label-free row {m['attack']} eps {m['eps']} is not the planned one")
            row = ResultRow.from_json(results.stamp_ids(_row(base, ident, m, cfg, n_examples, shared)))
            if row.row_id in done:  # finished before an interruption: never rewritten
                rows.append(done[row.row_id])
                continue
            results.write_row(out, row)
            rows.append(row)
        return rows, len(ids) - len(done)


def _row(
    base: dict[str, Any],
    ident: dict[str, Any],
    m: dict[str, Any],
    cfg: LabelFreeConfig,
    n_examples: int | None,
    shared: dict[str, Any],
) -> dict[str, Any]:
    """A whole row: the checkpoint fields, its identity, what was measured and the provenance."""
    a = ATTACKS.get(ident["attack"])
    return {
        **base,
        **ident,
        "shift": None,
        "split": "test",
        "suite": "label-free",
        "eps_label": eps_label(ident["eps"]),
        "attack_config": attack_params(cfg, a, ident["eps"]),
        "attack_family": "representation",
        "n_examples_requested": n_examples,
        **m,
        **shared,
    }


def data_for(
    dataset: str, folder: Path | None, channels: int | None, size: int | None, data_root: str | None
) -> LabelFreeData:
    """The protocol's data: an unlabeled folder's images, or a dataset's test split (the bank) with
    its labels and training split (the kNN read-outs)."""
    if folder is not None:
        name, x = load_image_folder(folder, channels, size)
        return LabelFreeData(name, x)
    from ..data import load_dataset, parse_spec

    spec = parse_spec(dataset).canonical()
    test = load_dataset(spec, "test", root=data_root)
    train = load_dataset(spec, "train", root=data_root)
    return LabelFreeData(str(spec), test.x, test.y, train.x, train.y, train.num_classes)
