"""Why DynACL-AIR++ fell below DynACL-AIR on the reference board: the converse experiments (issue 47).

    python bench/air_pp_causes.py run [--only VARIANT] [--seeds 0,1,2]   # post-process + evaluate (resumable)
    python bench/air_pp_causes.py table [--json bench/air_pp_causes.jsonl]

Each variant post-processes the published Fashion-MNIST parent of seeds 0-2 (``dynacl_air`` or
``dynacl``) with one "++" reading, then evaluates the result as the reference board does in-domain:
SLF and ALF with the board's probe, finetuning and suite flags (``fashion-mnist-aa``: AutoAttack
standard at 0.032 on 500 test examples). The variants change one thing at a time:

- ``air++ 2023-10``: the third edition's DynACL-AIR++ (AIR's October-2023 LP-AFF.py: attack target
  through the clean branch, start at x + 0.001 N, one cluster per class, tol 1e-5). Its checkpoints
  are the third edition's published weights (git history keeps them); its in-domain AutoAttack rows
  are the board's, kept in ``bench/air_pp_causes_rows/``.
- ``air++ 2023-10, adv target``: the same with the attack's target through the adversarial branch:
  the one change.
- ``air++ 2023-04``: the full April-2023 reading (the new default ``air++``; the fourth edition's
  DynACL-AIR++, rows and weights published).
- ``dynacl++``: the board's DynACL++ (rows and weights published).
- ``dynacl++, clean target``: the converse, DynACL++ with the attack aimed at the clean branch's
  prediction; it should fall below its parent if the explanation holds.

Rows are looked up by the checkpoint's weights sha256 in ``--rows`` folders (this script's own and
``leaderboard/rows``) before anything is computed; ``run`` resumes where it stopped (``post`` from its
per-epoch state, ``eval`` skips rows it has). ``table`` prints the means over seeds with 95 %
t-intervals, each variant beside its parent and minus its parent seed by seed (the same parent weights
and test examples: a paired difference), then the comparisons that isolate a cause (``COMPARISONS``: a
variant minus another, seed by seed), and the clean/adversarial branch agreement per AFT epoch that
post-processing logs (``post.aft_monitor``); ``--json`` writes one line per variant (the comparisons
under ``minus``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "robustbench_out" / "air_pp_causes"
PUBLISHED = ROOT / "robustbench_nacl" / "files" / "published" / "fashion-mnist" / "models"
#: the third edition's in-domain AutoAttack rows of its DynACL-AIR++ (the October reading), kept here
#: as the board made them: the fourth edition sets them aside from leaderboard/
THIRD_EDITION = Path(__file__).resolve().parent / "air_pp_causes_rows"
ROW_FOLDERS = (OUT / "rows", ROOT / "leaderboard" / "rows", THIRD_EDITION)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    parent: str  # the parent family (the board's loss)
    recipe: str  # the post-processing recipe
    overrides: dict[str, str]
    made_by: str  # "here" (this script), "published" (the package's weights),
    # "third-edition" (weights named by the kept rows of THIRD_EDITION)
    entry_loss: str = ""  # the board entry it is, when it is one


VARIANTS = [
    Variant("air++ 2023-10", "dynacl_air", "air++-2023-10", {}, "third-edition", "dynacl_air++"),
    Variant(
        "air++ 2023-10, adv target", "dynacl_air", "air++-2023-10", {"attack_target_route": "adv"}, "here"
    ),
    # the fourth edition's DynACL-AIR++: `zoo train` made it, `zoo publish` shipped the same weights
    Variant("air++ 2023-04", "dynacl_air", "air++", {}, "published", "dynacl_air++"),
    Variant("dynacl++", "dynacl", "dynacl++", {}, "published", "dynacl++"),
    Variant("dynacl++, clean target", "dynacl", "dynacl++", {"attack_target_route": "clean"}, "here"),
]
#: the variant comparisons that isolate a cause, paired by seed: (variant, minus this one, what differs)
COMPARISONS = [
    ("air++ 2023-10, adv target", "air++ 2023-10", "the attack target alone"),
    ("dynacl++, clean target", "dynacl++", "the attack target alone"),
    ("air++ 2023-04", "air++ 2023-10, adv target", "start, cluster count, tolerance"),
]
SLUG = {v.name: v.name.replace(" ", "_").replace(",", "").replace("+", "p") for v in VARIANTS}


def _entry_id(loss: str, seed: int) -> str:
    return f"convnet_small.{loss}_fashion-mnist-0-4_s{seed}"


def checkpoint(v: Variant, seed: int) -> Path:
    """Where the variant's checkpoint of ``seed`` is (or will be)."""
    if v.made_by == "published":
        return PUBLISHED / _entry_id(v.entry_loss, seed)
    return OUT / "ckpt" / f"{SLUG[v.name]}_s{seed}"


def parent_checkpoint(v: Variant, seed: int) -> Path:
    return PUBLISHED / _entry_id(v.parent, seed)


def _eval_args(seed: int, parent_loss: str) -> dict[str, Any]:
    """The board's in-domain SLF and ALF flags for a seed (the parent's zoo entry's eval block)."""
    from robustbench_nacl.pipeline import eval_arguments
    from robustbench_nacl.zoo import load_zoo

    entry = next(e for e in load_zoo("fashion-mnist") if e.id == _entry_id(parent_loss, seed))
    args = eval_arguments(entry)
    return args | {"transfer": None, "shift": None, "corruptions": None, "severities": None,
                   "protocol": "slf,alf", "setting_suites": None}  # fmt: skip


def _rows_of(sha: str) -> dict[str, dict[str, Any]]:
    """protocol -> the in-domain AutoAttack@0.032 row of the weights ``sha`` in the row folders."""
    return _index().get(sha, {})


_INDEX: dict[str, dict[str, dict[str, Any]]] = {}


def _index() -> dict[str, dict[str, dict[str, Any]]]:
    """sha256 -> protocol -> row, of every in-domain AutoAttack@0.032 row in the folders (read once;
    ``run`` clears it after writing rows)."""
    if _INDEX:
        return _INDEX
    for folder in ROW_FOLDERS:
        for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            text = f.read_text()
            if '"autoattack"' not in text or '"in-domain"' not in text:
                continue
            r = json.loads(text)
            if r.get("setting") != "in-domain" or r.get("attack") != "autoattack":
                continue
            if abs(float(r.get("eps", 0)) - 0.032) > 1e-9:
                continue
            proto = (r.get("finetune") or {}).get("protocol", "slf")
            _INDEX.setdefault(str(r["checkpoint_sha256"]), {}).setdefault(proto, r)
    return _INDEX


def _sha(ckpt: Path) -> str | None:
    m = ckpt / "manifest.json"
    return str(json.loads(m.read_text())["weights_sha256"]) if m.is_file() else None


def variant_sha(v: Variant, seed: int) -> str | None:
    """The weights sha256 of the variant's checkpoint of ``seed`` (None: not made yet)."""
    if v.made_by == "third-edition":
        for f in sorted(THIRD_EDITION.glob("*.json")):
            r = json.loads(f.read_text())
            if r.get("train_seed") == seed:
                return str(r["checkpoint_sha256"])
        return None
    return _sha(checkpoint(v, seed))


def run(variants: list[Variant], seeds: list[int]) -> None:
    """Make what is missing: the checkpoints this script owns, then their SLF/ALF rows."""
    from robustbench_nacl.eval.evaluate import evaluate
    from robustbench_nacl.post import post_process

    for v in variants:
        for s in seeds:
            ckpt = checkpoint(v, s)
            if v.made_by == "here":
                post_process(
                    parent_checkpoint(v, s), v.recipe, ckpt, overrides=dict(v.overrides), device="cpu"
                )
            sha = variant_sha(v, s)
            if sha is None or v.made_by == "third-edition":
                why = "no checkpoint yet" if sha is None else "its rows are kept"
                print(f"{v.name} s{s}: made by {v.made_by}, not here ({why}); skipped")
                continue
            if {"slf", "alf"} <= set(_rows_of(sha)):
                print(f"{v.name} s{s}: rows exist")
                continue
            evaluate(ckpt, out=OUT, device="cpu", **_eval_args(s, v.parent))
            _INDEX.clear()


def _mean_ci(values: list[float]) -> tuple[float, float, float] | None:
    from robustbench_nacl.report.stats import t_interval

    if not values:
        return None
    lo, hi = t_interval(values) if len(values) > 1 else (values[0], values[0])
    return statistics.fmean(values), lo, hi


def summary(seeds: list[int]) -> list[dict[str, Any]]:
    """One record per variant and its parent: per protocol, clean and AutoAttack per seed, their
    means and 95 % t-intervals; the branch agreement per AFT epoch per seed (where logged)."""
    out = []
    for v in VARIANTS:
        rec: dict[str, Any] = {
            "variant": v.name,
            "recipe": v.recipe,
            "overrides": v.overrides,
            "parent": v.parent,
        }
        for who, sha_of in (
            ("variant", lambda s, v=v: variant_sha(v, s)),
            ("parent", lambda s, v=v: _sha(parent_checkpoint(v, s))),
        ):
            for proto in ("slf", "alf"):
                per_seed = {}
                for s in seeds:
                    sha = sha_of(s)
                    row = _rows_of(sha).get(proto) if sha else None
                    if row is not None:
                        per_seed[s] = (row["clean_acc"], row["robust_acc"], row["row_id"])
                rec[f"{who}_{proto}"] = {
                    "seeds": {
                        s: {"clean": c, "autoattack": a, "row_id": i} for s, (c, a, i) in per_seed.items()
                    },
                    "clean": _mean_ci([c for c, _, _ in per_seed.values()]),
                    "autoattack": _mean_ci([a for _, a, _ in per_seed.values()]),
                }
        for proto in ("slf", "alf"):
            mine, theirs = rec[f"variant_{proto}"]["seeds"], rec[f"parent_{proto}"]["seeds"]
            rec[f"paired_{proto}"] = _paired(mine, theirs)
        rec["aft_monitor"] = {}
        for s in seeds:
            m = checkpoint(v, s) / "manifest.json"
            if v.made_by != "third-edition" and m.is_file():
                mon = json.loads(m.read_text()).get("post", {}).get("aft_monitor")
                if mon:
                    rec["aft_monitor"][s] = [(r["epoch"], r["agreement"], r["feature_cosine"]) for r in mon]
        out.append(rec)
    by_name = {r["variant"]: r for r in out}
    for name, other, _ in COMPARISONS:  # a cause isolated: one variant minus another, by seed
        by_name[name].setdefault("minus", {})[other] = {
            proto: _paired(
                by_name[name][f"variant_{proto}"]["seeds"], by_name[other][f"variant_{proto}"]["seeds"]
            )
            for proto in ("slf", "alf")
        }
    return out


def _paired(mine: dict[int, dict[str, Any]], theirs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """AutoAttack of ``mine`` minus ``theirs`` on the seeds both have, and its mean with a t-interval.
    A seed's variants and its parent share the parent's weights and the test examples, so the
    per-seed differences are the comparison to make."""
    diff = {s: mine[s]["autoattack"] - theirs[s]["autoattack"] for s in mine if s in theirs}
    return {"seeds": diff, "autoattack": _mean_ci(list(diff.values()))}


def _fmt(stat: tuple[float, float, float] | None, n: int) -> str:
    if stat is None:
        return "–"
    m, lo, hi = stat
    # an accuracy's t-interval over two or three seeds can leave [0, 100]: clipped, as the board does
    lo, hi = max(lo, 0.0), min(hi, 1.0)
    return f"{100 * m:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] (n={n})"


def _fmt_paired(paired: dict[str, Any]) -> str:
    if paired["autoattack"] is None:
        return "–"
    m, lo, hi = paired["autoattack"]
    each = " ".join(f"{100 * d:+.1f}" for _, d in sorted(paired["seeds"].items()))
    return f"{100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] (seeds: {each})"


def print_table(records: list[dict[str, Any]], seeds: list[int]) -> None:
    print(
        "| variant | protocol | clean | AutoAttack@0.032 | parent clean | parent AutoAttack@0.032 "
        "| AutoAttack minus parent's, paired by seed |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in records:
        for proto in ("slf", "alf"):
            a, p = r[f"variant_{proto}"], r[f"parent_{proto}"]
            na, np_ = len(a["seeds"]), len(p["seeds"])
            cells = [
                _fmt(a["clean"], na),
                _fmt(a["autoattack"], na),
                _fmt(p["clean"], np_),
                _fmt(p["autoattack"], np_),
                _fmt_paired(r[f"paired_{proto}"]),
            ]
            print(f"| {r['variant']} | {proto.upper()} | " + " | ".join(cells) + " |")
    print()
    made_by = {v.name: v.made_by for v in VARIANTS}
    for r in records:  # a "–" says why: the rows this script makes are not in the repository
        missing = [s for s in seeds if any(s not in r[f"variant_{p}"]["seeds"] for p in ("slf", "alf"))]
        if missing:
            todo = ",".join(map(str, missing))
            how = (
                f"python bench/air_pp_causes.py run --only {r['variant']!r} --seeds {todo}"
                if made_by[r["variant"]] == "here"
                else f"its weights are the {made_by[r['variant']]} ones, which this script does not make"
            )
            print(f"no SLF/ALF rows for {r['variant']!r}, seed(s) {todo}: {how}")
    by_name = {r["variant"]: r for r in records}
    print("| variant | minus | what differs | protocol | AutoAttack difference, paired by seed |")
    print("|---|---|---|---|---|")
    for name, other, what in COMPARISONS:
        for proto in ("slf", "alf"):
            cell = _fmt_paired(by_name[name]["minus"][other][proto])
            print(f"| {name} | {other} | {what} | {proto.upper()} | {cell} |")
    print()
    for r in records:
        for s, mon in sorted(r["aft_monitor"].items()):
            agree = " ".join(f"{100 * a:.0f}" for _, a, _ in mon)
            print(f"{r['variant']} s{s}: agreement per AFT epoch (after LP first), %: {agree}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("run", "table"))
    p.add_argument("--only", action="append", help="a variant's name (repeatable; default: all)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--json", type=Path, help="table: write one JSON line per variant here")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    chosen = [v for v in VARIANTS if not a.only or v.name in a.only]
    if a.action == "run":
        run(chosen, seeds)
    records = summary(seeds)
    print_table(records, seeds)
    if a.json:
        a.json.write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
