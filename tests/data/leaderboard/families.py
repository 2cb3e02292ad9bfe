"""Seventeen leaderboard lines with known per-example outcomes, generated (not stored).

Every loss family of the demo zoo plus a random-init control, `convnet_small` on digits classes
0-4, the `paper` suite (FGSM sweep, PGD at 0.002, worst case at every eps), 180 test examples,
in-domain, transfer to digits:5-9 and two shifts. simclr, nca and intnacl have two training seeds,
the others one. The accuracies are modelled on the README's demo table; the per-example outcomes
(``clean_bits``, ``robust_bits``) are drawn from a fixed generator with a per-example difficulty
shared by every recipe (as real test examples are), so paired tests see realistic overlaps. Robust
sets are nested: an example robust at a larger eps, or under the worst case, is robust at every
smaller eps and under every single attack.

``make_rows()`` returns the rows as JSON dicts (with their ids computed by the library);
``python tests/data/leaderboard/families.py OUT`` writes them as a rows directory.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from robustbench_nacl.results.bits import encode_bits
from robustbench_nacl.results.eps import eps_label
from robustbench_nacl.results.rows import ResultRow, load_rows, stamp_ids, write_row

ROWS = Path(__file__).parent / "rows"
N = 180
EPS = (0.002, 0.004, 0.008, 0.016, 0.032)
# fraction of the clean-to-robust@0.032 drop already lost at each eps
DROP = {0.002: 0.04, 0.004: 0.12, 0.008: 0.3, 0.016: 0.6, 0.032: 1.0}
# name: (setting, evaluated dataset, shift)
SETTINGS = {
    "in-domain": ("in-domain", "digits:0-4", None),
    "transfer": ("transfer", "digits:5-9", None),
    "shift-flip": ("shift", "digits:0-4@flip", "flip"),
    "shift-crop": ("shift", "digits:0-4@crop", "crop"),
}
# family: (key parameters, {setting: (clean %, worst case @0.032 %)}, training seeds)
FAMILIES: dict[str, tuple[str, tuple[tuple[float, float], ...], tuple[int, ...]]] = {
    "simclr": ("", ((95.6, 88.9), (82.2, 65.6), (80.0, 62.0), (84.0, 70.0)), (0, 1)),
    "debiased": ("G1=g1 tau_plus=0.01", ((95.6, 88.3), (83.3, 65.0), (79.0, 60.0), (83.0, 68.0)), (0,)),
    "hardneg": ("G1=g2 beta=1.0", ((85.6, 77.8), (82.8, 59.4), (75.0, 58.0), (78.0, 64.0)), (0,)),
    "debiased_hardneg": (
        "G1=g2 tau_plus=0.01 beta=1.0",
        ((88.9, 77.2), (81.1, 55.6), (76.0, 57.0), (80.0, 63.0)),
        (0,),
    ),
    "adv": ("alpha=1.0", ((88.3, 80.0), (78.3, 60.6), (74.0, 59.0), (79.0, 66.0)), (0,)),
    "nca": (
        "G1=g2 M=3 tau_plus=0.01 beta=1.0",
        ((97.2, 87.8), (81.7, 61.1), (82.0, 66.0), (86.0, 72.0)),
        (0, 1),
    ),
    "mixnca": (
        "G1=g2 M=3 lam=0.5 tau_plus=0.01 beta=1.0",
        ((92.2, 76.1), (86.7, 67.8), (78.0, 58.0), (82.0, 64.0)),
        (0,),
    ),
    "nca_mixnca": (
        "G1=g2 M=3 lam=0.5 combine=True tau_plus=0.01 beta=1.0",
        ((95.0, 82.8), (78.3, 65.0), (80.0, 61.0), (84.0, 69.0)),
        (0,),
    ),
    "var": (
        "G1=g2 M=3 positives=var tau_plus=0.01 beta=1.0",
        ((93.9, 86.7), (81.7, 60.0), (79.0, 64.0), (83.0, 71.0)),
        (0,),
    ),
    "intcl": (
        "G1=g2 alpha=1.0 G2=g2 w=w_hat tau_plus=0.01 beta=1.0",
        ((92.2, 82.8), (84.4, 59.4), (77.0, 60.0), (81.0, 66.0)),
        (0,),
    ),
    "intnacl": (
        "G1=g2 M=3 lam=0.5 alpha=1.0 G2=g2 w=w_hat tau_plus=0.01 beta=1.0",
        ((91.1, 84.4), (83.3, 58.9), (78.0, 65.0), (82.0, 70.0)),
        (0, 1),
    ),
    "arcl": ("positives=worst_pair", ((92.8, 81.7), (85.6, 64.4), (81.0, 67.0), (85.0, 73.0)), (0,)),
    "dacl": ("t=1.0 views=dacl", ((93.9, 86.1), (78.9, 60.6), (76.0, 59.0), (80.0, 65.0)), (0,)),
    "dacl_plus": ("t=1.0 views=dacl_plus", ((95.0, 86.1), (75.0, 58.3), (77.0, 60.0), (81.0, 67.0)), (0,)),
    "gaussian": ("t=0.1 views=gaussian", ((91.7, 83.3), (86.1, 71.7), (79.0, 63.0), (83.0, 69.0)), (0,)),
    "supervised": ("views=crop_flip", ((95.0, 83.3), (81.1, 58.9), (80.0, 60.0), (85.0, 68.0)), (0,)),
    "random-init": ("", ((85.6, 40.0), (80.0, 35.0), (70.0, 30.0), (74.0, 33.0)), (0,)),
}


def _rng(*parts: Any) -> np.random.Generator:
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _first(order: np.ndarray, k: int) -> np.ndarray:
    mask = np.zeros(N, bool)
    mask[order[:k]] = True
    return mask


def outcomes(family: str, seed: int, setting: str) -> dict[str, np.ndarray]:
    """Per-example outcomes of one run: "clean", ("fgsm", eps), ("pgd", 0.002), ("worst_case", eps)."""
    _, accs, _ = FAMILIES[family]
    clean_pct, worst_pct = accs[list(SETTINGS).index(setting)]
    jitter = 1.1 * seed  # a second training seed lands about two examples higher
    shared = _rng("examples", setting)  # difficulty of each test example, the same for every recipe
    hard, fragile = shared.random(N), shared.random(N)
    own = _rng(family, seed, setting)
    k_clean = round(N * min(100.0, clean_pct + jitter) / 100)
    k_worst = round(N * min(clean_pct, worst_pct + jitter) / 100)
    clean_order = np.argsort(hard + 0.6 * own.random(N), kind="stable")[:k_clean]
    robust_order = clean_order[np.argsort(fragile[clean_order] + 0.6 * own.random(k_clean), kind="stable")]
    out: dict[Any, np.ndarray] = {"clean": _first(clean_order, k_clean)}
    for eps in EPS:
        k = round(k_clean - (k_clean - k_worst) * DROP[eps])
        out[("fgsm", eps)] = out[("worst_case", eps)] = _first(robust_order, k)
    k_pgd = round(k_clean - (k_clean - k_worst) * 0.07)  # PGD finds a few more than FGSM at 0.002
    out[("pgd", 0.002)] = out[("worst_case", 0.002)] = _first(robust_order, k_pgd)
    return out


def _template() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(trained row, control row, PGD attack params) of the hand-written fixture, as templates."""
    rows = load_rows(ROWS)
    trained = next(r for r in rows if r["loss"] == "nca" and r["setting"] == "in-domain")
    control = next(r for r in rows if r["control"] and r["setting"] == "in-domain")
    pgd = next(r for r in rows if r["attack"] == "pgd")
    return trained.to_json(), control.to_json(), dict(pgd["attack_params"])


def _loss_params(base: dict[str, Any], key_params: str) -> dict[str, Any]:
    params = dict(base)
    for tok in key_params.split():
        k, v = tok.split("=", 1)
        params[k] = v if not v.replace(".", "", 1).isdigit() else (float(v) if "." in v else int(v))
    return params


def _run_base(family: str, seed: int, templates: tuple[dict, dict, dict]) -> dict[str, Any]:
    trained, control, _ = templates
    key_params, _, _ = FAMILIES[family]
    is_control = family == "random-init"
    row = json.loads(json.dumps(control if is_control else trained))
    name = f"convnet_small.{family}_digits-0-4_s{seed}"
    sha = hashlib.sha256(name.encode()).hexdigest()
    row |= {"checkpoint_id": name, "checkpoint": f"zoo/{name}", "checkpoint_sha256": sha, "train_seed": seed}
    if not is_control:
        params = _loss_params(row["loss_params"], key_params)
        row |= {"loss": family, "key_params": key_params, "loss_params": params}
        row["recipe"]["config"] |= {"loss": family, "loss_params": params, "epochs": 10}
    return row


def _metric_fields(attack: str, eps: float, pgd_params: dict[str, Any]) -> dict[str, Any]:
    params = pgd_params if attack == "pgd" else {}
    family = {"fgsm": "single_step", "pgd": "iterative"}.get(attack, "worst_case")
    return {"attack": attack, "norm": "Linf", "eps": eps, "eps_label": eps_label(eps)} | {
        "attack_params": params,
        "attack_family": family,
    }


def make_rows() -> list[dict[str, Any]]:
    """Every row of the seventeen lines (JSON dicts, ids stamped), in a stable order."""
    templates = _template()
    rows = []
    for family, (_, _, seeds) in FAMILIES.items():
        for seed in seeds:
            base = _run_base(family, seed, templates)
            for name, (setting, dataset, shift) in SETTINGS.items():
                outs = outcomes(family, seed, name)
                clean = outs["clean"]
                for (attack, eps), robust in ((k, v) for k, v in outs.items() if k != "clean"):
                    row = base | _metric_fields(attack, eps, templates[2])
                    row |= {"setting": setting, "dataset": dataset, "shift": shift}
                    row |= {"n_examples": N, "n_examples_evaluated": N, "n_attacked": int(clean.sum())}
                    row |= {"clean_acc": float(clean.sum() / N), "robust_acc": float(robust.sum() / N)}
                    row |= {"n_clean_correct": int(clean.sum()), "n_robust": int(robust.sum())}
                    row |= {"clean_bits": encode_bits(clean), "robust_bits": encode_bits(robust)}
                    row |= {"sanity_ok": True, "sanity_failed": "", "sanity_attack_beats_noise": True}
                    rows.append(stamp_ids(row))
    return rows


def main(out: str) -> int:
    for row in make_rows():
        write_row(out, ResultRow.from_json(row))
    print(f"wrote {len(make_rows())} rows under {out}/rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
