"""The label-free protocol's settings, the rows it writes and the measures read from them (no torch).

``--protocol label-free`` attacks the frozen encoder's representation itself: no head, no labels
(eval/label_free.py runs it, attack/representation.py holds the attacks, report/label_free.py
renders its table). Its rows are ordinary result rows: one per (measure, eps), with
``robust_acc`` the fraction of examples the attack did not break and ``robust_bits`` / ``clean_bits``
the per-example outcomes, so they pair across recipes like every other row; the continuous
per-example values (cosine, normalised distance, universal quantile, breakaway, margin) ride in
``per_example``. The protocol's settings are the rows' ``finetune`` identity (the field every
protocol other than the cached-feature SLF probe records itself in), so label-free rows never share
a protocol id, a table or a ranking with SLF, ALF or AFF. docs/decisions.md, 'Label-free
robustness', says what each measure follows in its authors' code and where it differs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import UserError
from ..io import canonical_json
from ..registry import Registry
from .rows import DEVICE_CLASS

#: the protocol's name (``--protocol label-free``; the rows' ``finetune.protocol``)
LABEL_FREE = "label-free"
#: the setting label-free rows are measured in (the evaluated data: the in-domain test split, or an
#: unlabeled image folder standing in for it)
SETTING = "in-domain"
#: the dataset string of an unlabeled image folder's rows: ``images:<folder name>@<sha256[:12]>`` of
#: the decoded images, so two folders never share a row id
FOLDER_PREFIX = "images:"


@dataclass(frozen=True)
class LabelFreeConfig:
    """The label-free protocol (layer6 ssl-robustness's attack settings, Petrov et al.'s read-outs)."""

    eps: str = "0.002,0.004,0.008,0.016,0.032"  # L-inf budgets, [0,1] pixel units (the paper suite's)
    steps: int = 20  # sign-PGD steps of every attack (layer6 attack_num_steps: 20)
    step_size: float | None = None  # None: eps / 4 (layer6 attack_lr 2/255 at attack_epsilon 8/255)
    quantile_batch: int = 256  # clean embeddings per batch of pairwise distances (Petrov et al.: 256)
    sanity_n: int = 64  # examples the unbounded (eps 1) sanity attack runs on

    protocol = LABEL_FREE

    def eps_values(self) -> list[float]:
        """The budgets as sorted floats (a one-line UserError if malformed)."""
        try:
            out = sorted({float(p) for p in str(self.eps).split(",") if p.strip()})
        except ValueError:
            raise UserError(
                f"label-free eps {self.eps!r}: give a comma list of numbers, e.g. 0.016,0.032"
            ) from None
        if not out or any(not (math.isfinite(e) and 0 < e <= 1) for e in out):
            raise UserError(f"label-free eps {self.eps!r}: each must be in (0, 1] ([0,1] pixel units)")
        return out

    def step(self, eps: float) -> float:
        """The step size at ``eps``: the configured one, else eps / 4."""
        return float(self.step_size) if self.step_size is not None else eps / 4

    def check(self) -> None:
        """Raise a one-line UserError for a setting that cannot be run."""
        self.eps_values()
        for k in ("steps", "quantile_batch", "sanity_n"):
            v = getattr(self, k)
            low = 2 if k == "quantile_batch" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UserError(f"label-free {k.replace('_', '-')} {v!r}: must be an integer >= {low}")
        s = self.step_size
        if s is not None and not (isinstance(s, (int, float)) and math.isfinite(s) and 0 < s <= 1):
            raise UserError(f"label-free step-size {s!r}: must be in (0, 1] (or unset: eps / 4)")

    def identity(self) -> dict[str, Any]:
        """What enters every row's identity (the ``finetune`` field): the settings, eps normalised."""
        out = {"protocol": LABEL_FREE, **asdict(self)}
        out["eps"] = ",".join(f"{e:g}" for e in self.eps_values())
        return out

    def sha256(self) -> str:
        """The rows' ``suite_sha256``: the hash of :meth:`identity` (the protocol has no suite file)."""
        return hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()


@dataclass(frozen=True)
class LabelFreeAttack:
    """One row kind of the protocol: which attack produced it and whether it needs labels."""

    name: str
    objective: str  # the representation objective the attack optimises (attack/representation.py)
    targeted: bool
    labelled: bool  # a kNN read-out: needs the training split's labels (absent for an image folder)
    summary: str


#: the rows of one eps, in order (registered: a new read-out is one entry)
ATTACKS: Registry[LabelFreeAttack] = Registry("label-free attack")
for _a in (
    LabelFreeAttack("repr_pgd_cos", "cos", False, False, "untargeted, cosine objective: self-retrieval kept"),
    LabelFreeAttack("repr_pgd_l2", "l2", False, False, "untargeted, L2 objective: self-retrieval kept"),
    LabelFreeAttack("impersonation", "l2", True, False, "targeted at a partner: not its nearest neighbour"),
    LabelFreeAttack("margin", "l2", True, False, "Petrov's adversarial margin of the pair >= 0"),
    LabelFreeAttack("knn_repr_cos", "cos", False, True, "kNN accuracy on the cosine attack's embedding"),
    LabelFreeAttack("knn_repr_l2", "l2", False, True, "kNN accuracy on the L2 attack's embedding"),
):
    ATTACKS.add(_a.name, _a)


def attack_params(cfg: LabelFreeConfig, attack: LabelFreeAttack, eps: float) -> dict[str, Any]:
    """The ``attack_params`` of one row (part of its identity)."""
    return {
        "objective": attack.objective,
        "targeted": attack.targeted,
        "steps": cfg.steps,
        "step_size": cfg.step(eps),
        "start": "uniform",
    }


def identities(
    cfg: LabelFreeConfig,
    *,
    dataset: str,
    checkpoint_sha256: str | None,
    seed: int,
    n_examples: int | None,
    probe_config: Mapping[str, Any],
    attack_versions: Mapping[str, Any],
    labelled: bool,
    device_class: str | None = None,
) -> list[dict[str, Any]]:
    """The identity of every row one label-free evaluation writes (computable without the
    checkpoint: ``checkpoint_sha256`` None), in order: per eps, each attack of :data:`ATTACKS`
    (the kNN read-outs only with labels)."""
    out = []
    for eps in cfg.eps_values():
        for name in ATTACKS:
            a = ATTACKS.get(name)
            if a.labelled and not labelled:
                continue
            out.append(
                {
                    "checkpoint_sha256": checkpoint_sha256,
                    "setting": SETTING,
                    "dataset": dataset,
                    "attack": a.name,
                    "norm": "Linf",
                    "attack_params": attack_params(cfg, a, eps),
                    "eps": eps,
                    "seed": seed,
                    "n_examples": n_examples,
                    "probe_config": dict(probe_config),
                    "suite_sha256": cfg.sha256(),
                    "attack_versions": dict(attack_versions),
                    "finetune": cfg.identity(),
                    # absent on a CPU: a GPU's row never stands for a CPU's
                    **({DEVICE_CLASS: device_class} if device_class is not None else {}),
                }
            )
    return out


def is_label_free(row: Mapping[str, Any]) -> bool:
    """Whether a row was measured under the label-free protocol."""
    ft = row.get("finetune")
    return isinstance(ft, Mapping) and ft.get("protocol") == LABEL_FREE


# ============ measures: how each label-free number is read from a row ============


@dataclass(frozen=True)
class Measure:
    """One label-free number per run, read from the row of ``attack`` at one eps: the mean of its
    per-example ``key`` values, or (``key`` None) its ``robust_acc``, a fraction of examples.
    ``sign`` orients it for rankings: +1 when higher is more robust, -1 when lower is. ``bounds``:
    the range its per-example values can take; an interval is clipped to it, as an accuracy's is
    to [0, 1] (a t-interval over three seeds can otherwise give a cosine above 1)."""

    name: str
    attack: str
    label: str
    key: str | None = None
    sign: float = 1.0
    bounds: tuple[float, float] = (-math.inf, math.inf)

    @property
    def fraction(self) -> bool:
        """A fraction of examples in [0, 1] (a Wilson interval for one run); else a mean."""
        return self.key is None

    def read(self, row: Mapping[str, Any]) -> float | None:
        """The measure of one row (None where the row lacks its values): the mean over the examples
        that have one (a pair whose clean embeddings coincide has no margin ratio, NaN, skipped as
        Petrov et al.'s pandas mean skips it)."""
        if self.key is None:
            return float(row["robust_acc"])
        values = per_example(row, self.key)
        if values is None or not len(values) or np.isnan(values).all():
            return None
        return float(np.nanmean(values))


def encode_values(values: Any) -> str:
    """Per-example numbers as base64 text of little-endian float32 (a quarter of JSON's bytes)."""
    return base64.b64encode(np.asarray(values, dtype="<f4").ravel().tobytes()).decode("ascii")


def decode_values(text: str, n: int) -> np.ndarray:
    """The ``n`` float32 values :func:`encode_values` packed into ``text`` (one-line UserError if not)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise UserError(f"per-example values {str(text)[:40]!r} are not base64 text") from None
    if len(raw) != 4 * n:
        raise UserError(f"per-example values hold {len(raw)} bytes; {n} float32 values need {4 * n}")
    return np.frombuffer(raw, dtype="<f4").astype(float)


def per_example(row: Mapping[str, Any], key: str) -> np.ndarray | None:
    """A label-free row's per-example ``key`` values (None where the row has none)."""
    text = (row.get("per_example") or {}).get(key)
    return None if text is None else decode_values(text, int(row["n_examples_evaluated"]))


#: the measures the report shows and correlates, in order
MEASURES: Registry[Measure] = Registry("label-free measure")
for _m in (
    Measure("self_retrieval_cos", "repr_pgd_cos", "self-retrieval (cos attack)"),
    Measure("cos_sim", "repr_pgd_cos", "cosine to clean (cos attack)", "cos", bounds=(-1.0, 1.0)),
    Measure("self_retrieval_l2", "repr_pgd_l2", "self-retrieval (L2 attack)"),
    Measure("distance_l2", "repr_pgd_l2", "distance / median (L2 attack)", "dist", -1.0, (0.0, math.inf)),
    Measure("quantile_l2", "repr_pgd_l2", "universal quantile (L2 attack)", "uq", -1.0, (0.0, 1.0)),
    Measure("breakaway", "repr_pgd_l2", "breakaway risk", "breakaway", -1.0, (0.0, 1.0)),
    Measure("impersonation", "impersonation", "impersonation resisted"),
    Measure("margin", "margin", "adversarial margin ratio", "margin"),
    Measure("overlap", "margin", "margin >= 0 (no overlap)"),
    Measure("knn_cos", "knn_repr_cos", "kNN acc. (cos attack)"),
    Measure("knn_l2", "knn_repr_l2", "kNN acc. (L2 attack)"),
):
    MEASURES.add(_m.name, _m)
