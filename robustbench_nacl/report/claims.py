"""A paper's claims as data, each sorted by the rows into established, contradicted or not established.

A claims file (``files/claims/<name>.toml``, or any path) lists claims: a candidate loss family
against a baseline family on one metric, in one or more settings. Each (claim, setting, metric) is
one test (docs/decisions.md, 'Claims in three kinds'):

- ``better`` (the candidate is more accurate): **established** when McNemar's Holm-adjusted p is
  below 0.05 and the t-interval over seed pairs excludes 0 on the candidate's side,
  **contradicted** when the same holds on the baseline's side, **not established** otherwise;
- ``no_cost`` (equivalent within a margin, default 2 points): **established** ("equivalent within
  2 points") when two one-sided t-tests over the seed-paired differences reject non-equivalence
  after Holm, **contradicted** when a cost beyond the margin is established (Holm p < 0.05 and
  the whole seed interval below -margin), **not established** ("not shown") otherwise.

Holm runs over every p-value the verdicts of one claims file use: the McNemar test of each measured
test and the TOST of each ``no_cost`` test. :func:`reading` writes the result as Markdown
sentences, one per test, from the JSON alone (the leaderboard README's reading is that text).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..packaged import files_dir
from ..results.finetune import PROTOCOLS as PROTOCOL_NAMES
from ..results.rows import SETTINGS, protocol_name
from .aggregate import Entry, aggregate, validate_rows
from .compare import Comparison, compare_entries, is_family, select_baseline
from .fmt import fmt_diff, fmt_p
from .fmt import splice as splice_between
from .metrics import metric_key, metric_label
from .ranking import RankBy, parse_rank_by
from .stats import holm, tost_paired

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KINDS = ("better", "no_cost")
VERDICTS = ("established", "contradicted", "not established")
ALPHA = 0.05
DEFAULT_MARGIN = 2.0  # points: "no cost" means within 2 points of the baseline
DEFAULT_CLAIMS = "nacl"
_REQUIRED = ("id", "text", "candidate", "baseline", "kind", "settings", "metrics")
_OPTIONAL = ("source", "protocol", "dataset")
_TOP = ("name", "paper", "claim")
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"


@dataclass(frozen=True)
class Claim:
    """One test of a claim: the candidate family against the baseline family on one metric in one setting."""

    id: str  # "<claim id>/<setting>/<metric>"
    text: str
    candidate: str
    baseline: str
    kind: str
    setting: str
    metric: str  # as written: "clean" or ATTACK@EPS
    source: str = ""
    protocol: str = "slf"
    dataset: str | None = None


# ============ the claims file ============


def claims_dir() -> Path:
    """Where the shipped claims files live (``files/claims``)."""
    return files_dir() / "claims"


def claim_names() -> list[str]:
    """The names of the shipped claims files."""
    return sorted(p.stem for p in claims_dir().glob("*.toml"))


def _path(spec: str) -> Path:
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise UserError(f"--claims {spec}: no such file")
        return path
    if spec in claim_names():
        return claims_dir() / f"{spec}.toml"
    raise UserError(f"--claims {spec}: neither a file nor a shipped claims file ({', '.join(claim_names())})")


def _expand(raw: Any, where: str) -> list[Claim]:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: each [[claim]] must be a table")
    name = f"{where}, claim {raw.get('id', '?')}"
    if missing := [k for k in _REQUIRED if k not in raw]:
        raise UserError(f"{name}: missing {', '.join(missing)}")
    if unknown := sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL)):
        raise UserError(
            f"{name}: unknown field(s) {', '.join(unknown)}; known: {', '.join(_REQUIRED + _OPTIONAL)}"
        )
    if raw["kind"] not in KINDS:
        raise UserError(f"{name}: kind {raw['kind']!r} is not one of {', '.join(KINDS)}")
    settings, metrics = raw["settings"], raw["metrics"]
    for field, values in (("settings", settings), ("metrics", metrics)):
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise UserError(f"{name}: {field} must be a non-empty list of strings")
    if bad := [s for s in settings if s not in SETTINGS]:
        raise UserError(f"{name}: setting {bad[0]!r} is not one of {', '.join(SETTINGS)}")
    if raw.get("protocol", "slf") not in PROTOCOL_NAMES:
        raise UserError(f"{name}: protocol {raw['protocol']!r} is not one of {', '.join(PROTOCOL_NAMES)}")
    for m in metrics:
        _rank_by(m, name)
    extra = {k: str(raw[k]) for k in _OPTIONAL if k in raw}
    return [
        Claim(f"{raw['id']}/{s}/{m}", str(raw["text"]), str(raw["candidate"]), str(raw["baseline"]),
              raw["kind"], s, m, **extra)
        for s, m in itertools.product(settings, metrics)
    ]  # fmt: skip


def _rank_by(metric: str, where: str) -> RankBy:
    try:
        wanted = parse_rank_by(metric)
    except UserError:
        wanted = None
    if wanted is None or (wanted.attack != "clean" and wanted.eps is None):
        raise UserError(
            f"{where}: metric {metric!r} must be clean or ATTACK@EPS, e.g. fgsm@0.002, worst_case@8/255"
        )
    return wanted


def load_claims(spec: str) -> tuple[dict[str, str], list[Claim]]:
    """The claims file named ``spec`` (a shipped name or a path): its header and its tests, in file order."""
    path = _path(spec)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"--claims {spec}: cannot read {path}: {exc}") from None
    if unknown := sorted(set(data) - set(_TOP)):
        raise UserError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; known: {', '.join(_TOP)}")
    if not isinstance(data.get("claim"), list) or not data["claim"]:
        raise UserError(f"{path}: no [[claim]] tables")
    claims = [c for raw in data["claim"] for c in _expand(raw, str(path))]
    ids = [raw["id"] for raw in data["claim"]]
    if dup := sorted({i for i in ids if ids.count(i) > 1}):
        raise UserError(f"{path}: duplicate claim id(s) {', '.join(map(str, dup))}")
    tests = [c.id for c in claims]
    if dup := sorted({i for i in tests if tests.count(i) > 1}):
        raise UserError(f"{path}: a setting or metric listed twice: {', '.join(dup)}")
    return {"name": str(data.get("name", path.stem)), "paper": str(data.get("paper", ""))}, claims


# ============ testing the claims ============


def _group(groups: dict[tuple, list[Entry]], claim: Claim) -> tuple[list[Entry] | None, str]:
    """The entries of the one protocol the claim is tested under, or None and why."""
    keys = [k for k in groups if k[0] == claim.setting and k[2] == claim.protocol]
    if claim.dataset is not None:
        keys = [k for k in keys if k[1] == claim.dataset]
    if not keys:
        return None, f"no {claim.protocol.upper()} rows in {claim.setting}"
    if len(keys) > 1:
        which = "; ".join(f"{k[1]} (protocol {k[3][:8]})" for k in keys)
        raise UserError(
            f"claim {claim.id}: {len(keys)} {claim.protocol.upper()} protocols in {claim.setting}: {which}; "
            "name one with dataset = ... in the claims file, or compare rows of one protocol"
        )
    return groups[keys[0]], ""


def _compare(groups: dict[tuple, list[Entry]], claim: Claim) -> tuple[Comparison | None, str]:
    group, why = _group(groups, claim)
    if group is None:
        return None, why
    base, _ = select_baseline(group, claim.baseline, strict=False)
    cand, _ = select_baseline(group, claim.candidate, strict=False)
    if base is None or cand is None:
        family = claim.baseline if base is None else claim.candidate
        several = any(is_family(e, family) for e in group)  # else: none at all under this protocol
        return None, f"{'no single recipe' if several else 'no rows'} of {family} here"
    keys = sorted({metric_key(r) for e in group for r in e.rows})
    metric = _rank_by(claim.metric, claim.id).resolve(keys)
    if metric is None or metric not in base.values or metric not in cand.values:
        return None, f"{claim.metric} not measured for both"
    return compare_entries(base, cand, metric, metric_label(metric, keys)), ""


def _verdict(
    claim: Claim, c: Comparison | None, p: float | None, p_tost: float | None, margin: float
) -> tuple[str, str]:
    """(verdict, why) for one test: see the module docstring for the rules."""
    if c is None or c.diff is None:
        return "not established", "not measured"
    if c.n_pairs < 2 or c.interval != "t over seeds":
        return "not established", "fewer than two seed pairs: no seed interval"
    lo, hi = c.lo if c.lo is not None else -math.inf, c.hi if c.hi is not None else math.inf
    significant = p is not None and p < ALPHA
    if claim.kind == "no_cost":
        if p_tost is not None and p_tost < ALPHA:
            return "established", f"equivalent within {margin:g} points"
        if significant and hi < -margin / 100:
            return "contradicted", f"costs more than {margin:g} points"
        return "not established", f"equivalence within {margin:g} points not shown"
    if significant and (lo > 0 or hi < 0):
        return ("established" if lo > 0 else "contradicted"), ""
    test = "no McNemar test (rows without per-example outcomes)" if p is None else "Holm p >= 0.05"
    why = [w for w, bad in ((test, not significant), ("seed interval spans 0", lo <= 0 <= hi)) if bad]
    return "not established", "; ".join(why)


def evaluate_claims(
    rows: Sequence[Any], claims: Sequence[Claim], margin: float = DEFAULT_MARGIN
) -> list[dict[str, Any]]:
    """Each test of ``claims`` on ``rows``: its comparison, Holm-adjusted p-values and verdict (JSON records).

    ``margin``: the equivalence margin of ``no_cost`` claims, in points.
    """
    if not (math.isfinite(margin) and 0 < margin < 100):
        raise UserError(f"--margin {margin:g}: the equivalence margin must be between 0 and 100 points")
    entries, _ = aggregate(validate_rows(rows))
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[(e.setting, e.dataset, protocol_name(e.rows[0]), e.rank_pid)].append(e)
    found = [_compare(groups, c) for c in claims]
    tosts = [
        tost_paired(comp.diffs, margin / 100) if comp is not None and c.kind == "no_cost" else None
        for c, (comp, _) in zip(claims, found, strict=True)
    ]
    raw = [comp.p if comp is not None else None for comp, _ in found] + [t.p if t else None for t in tosts]
    adjusted = holm([math.nan if p is None else p for p in raw])
    adj = [None if math.isnan(a) else a for a in adjusted]
    out = []
    for i, (claim, (comp, why), tost) in enumerate(zip(claims, found, tosts, strict=True)):
        p, p_tost = adj[i], adj[len(claims) + i]
        verdict, reason = _verdict(claim, comp, p, p_tost, margin)
        found_json = {"verdict": verdict, "reason": why or reason, "p_holm": p, "p_tost": tost and tost.p}
        found_json |= {"p_tost_holm": p_tost, "comparison": None if comp is None else comp.to_json()}
        out.append(dataclasses.asdict(claim) | found_json)
    return out


def claims_json(header: dict[str, str], results: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    """What ``compare --claims --json`` prints: the header, the test rules and every test."""
    n_tests = sum(r["comparison"] is not None and r["comparison"]["p"] is not None for r in results)
    n_tests += sum(r["p_tost"] is not None for r in results)
    return {**header, "alpha": ALPHA, "margin_points": margin, "n_tests": n_tests, "claims": results}


# ============ output ============


def p_text(name: str, p: float | None) -> str:
    """``Holm p = 0.012`` or ``Holm p < 0.001``: a p-value in a sentence."""
    text = fmt_p(p)  # "<0.001" reads "p < 0.001"
    return f"{name} {text[0]} {text[1:]}" if text.startswith("<") else f"{name} = {text}"


def _numbers(r: dict[str, Any]) -> str:
    c = r["comparison"]
    pairs = f"{c['n_pairs']} seed pair{'s' * (c['n_pairs'] != 1)}"
    text = f"{fmt_diff(c['diff'], c['lo'], c['hi'])} points over {pairs}"
    text += f", {p_text('Holm p', r['p_holm'])}" if r["p_holm"] is not None else ", no McNemar test"
    return text + (f", {p_text('TOST Holm p', r['p_tost_holm'])}" if r["kind"] == "no_cost" else "")


def sentence(r: dict[str, Any]) -> str:
    """One test as a Markdown bullet: the claim, where it was tested, its numbers and why."""
    c = r["comparison"]
    protocol = f"{r['protocol'].upper()}, " if r.get("protocol", "slf") != "slf" else ""
    where = f"{r['setting']}, {protocol}{c['metric_label'] if c else r['metric']}"
    if c is None or c["diff"] is None:
        return f"- {r['text']} ({where}): not measured here ({r['reason']})."
    why = f"; {r['reason']}" if r["reason"] else ""
    return f"- {r['text']} ({where}): {_numbers(r)}{why}."


_HEADINGS = {
    "established": "**Established** (Holm p < 0.05 and a seed interval excluding 0, in the paper's "
    "direction; for a no-cost claim, equivalence shown)",
    "contradicted": "**Contradicted** (the same, in the opposite direction; for a no-cost claim, a cost "
    "beyond the margin)",
    "not established": "**Not established** (neither)",
}


def reading(data: dict[str, Any]) -> str:
    """The Markdown reading of ``compare --claims --json`` output: a legend and one sentence per test,
    grouped into established, contradicted and not established."""
    by_verdict: dict[str, list[str]] = {v: [] for v in VERDICTS}
    for r in data["claims"]:
        by_verdict[r["verdict"]].append(sentence(r))
    margin = f"{data['margin_points']:g}"
    lines = [
        f"Each claim of {data['paper'] or data['name']} (`--claims {data['name']}`), tested per setting and "
        "metric: candidate minus baseline accuracy in points with the 95 % t-interval over seed pairs; "
        f"Holm p: McNemar's exact test, adjusted over the {data['n_tests']} tests of these claims; no-cost "
        f"claims: two one-sided t-tests over the seed pairs with a margin of {margin} points (TOST), "
        "adjusted in the same family."
        + (
            " Each test is under SLF (a linear probe on the frozen encoder) unless it names ALF or AFF."
            if any(r.get("protocol", "slf") != "slf" for r in data["claims"])
            else ""
        ),
    ]
    for verdict in VERDICTS:
        lines += ["", f"{_HEADINGS[verdict]}: {len(by_verdict[verdict])} of {len(data['claims'])}.", ""]
        lines += by_verdict[verdict] or ["- none"]
    return "\n".join(_wrap(line) for line in lines) + "\n"


def _wrap(line: str, width: int = 100) -> str:
    # the README's own line width; a bullet's continuation lines are indented under its text
    indent = "  " if line.startswith("- ") else ""
    return textwrap.fill(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def format_claims(data: dict[str, Any]) -> str:
    """The tests as a text table (what ``compare --claims`` prints without ``--json``)."""
    from tabulate import tabulate

    body = []
    for r in data["claims"]:
        c = r["comparison"] or {}
        diff = fmt_diff(c.get("diff"), c.get("lo"), c.get("hi")) if c else "–"
        body.append([r["verdict"], r["id"], r["text"], diff, fmt_p(r["p_holm"]),
                     fmt_p(r["p_tost_holm"]) if r["kind"] == "no_cost" else "", r["reason"]])  # fmt: skip
    heads = ["verdict", "test", "claim", "Δ [95 % interval]", "p (Holm)", "TOST p (Holm)", "why"]
    return (
        reading(data).split("\n\n")[0]
        + "\n\n"
        + tabulate(body, heads, tablefmt="github", disable_numparse=True)
        + "\n"
    )


def markers(name: str = DEFAULT_CLAIMS) -> tuple[str, str]:
    """The README markers around the reading of claims file ``name`` (the NaCl file's are unnamed:
    ``<!-- claims:begin -->``; any other's ``<!-- claims:NAME:begin -->``)."""
    return (
        (BEGIN, END)
        if name == DEFAULT_CLAIMS
        else (f"<!-- claims:{name}:begin -->", f"<!-- claims:{name}:end -->")
    )


def splice(text: str, section: str, name: str = DEFAULT_CLAIMS) -> str:
    """``text`` with what lies between the markers of claims file ``name`` replaced by ``section``."""
    return splice_between(text, section, *markers(name))


def main_claims(
    rows_dirs: Sequence[str | Path] | str | Path,
    spec: str = DEFAULT_CLAIMS,
    *,
    margin: float = DEFAULT_MARGIN,
    output: str = "text",
) -> str:
    """CLI entry: test the claims file ``spec`` on the rows of every directory; ``output`` is
    ``text`` (a table), ``json`` or ``markdown`` (the reading)."""
    import json

    from .sources import load_dirs, pooled

    header, claims = load_claims(spec)
    data = claims_json(header, evaluate_claims(pooled(load_dirs(rows_dirs)), claims, margin), margin)
    if output == "json":
        return json.dumps(data, indent=1) + "\n"
    return reading(data) if output == "markdown" else format_claims(data)
