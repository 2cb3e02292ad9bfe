"""The reference leaderboard README's generated sections, so that no number in its reading is typed
by hand (docs/decisions.md, "Reference leaderboard"):

- ``claims`` and ``claims:robust-ssl``: the readings of the two shipped claims files
  (:func:`.claims.reading` of ``compare --claims NAME --json``);
- ``headroom``: each family's SLF in-domain clean and AutoAttack accuracy between the random-init
  control (0 %) and the supervised baseline (100 %), from the rows and the checkpoints' manifests,
  and what the pilot's learning curves (``BOARD/pilot/*/log.jsonl``, when there) gained
  (:mod:`.headroom`);
- ``beside``: beside the claims, the families with the highest and lowest difference to SimCLR in
  the main tables, from ``compare --baseline simclr --json`` (:func:`beside`);
- ``cost``: what each stage cost in core-seconds, from the manifests' and the rows' own timings
  (:func:`cost`);
- ``label-free``: the label-free table and its generated correlation with SLF AutoAttack
  (:mod:`.label_free`).

``python -m robustbench_nacl.report.readme BOARD MANIFESTS`` rewrites each section of
``BOARD/README.md`` between its markers, atomically; the tests regenerate each section from the
committed rows and compare.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import median
from types import SimpleNamespace
from typing import Any

from ..errors import UserError
from ..io import write_bytes_atomic
from ..results.rows import protocol_name
from .aggregate import CONTROL_LABEL
from .claims import p_text
from .figures import established
from .fmt import fmt_diff
from .fmt import splice as splice_between

BASELINE = "simclr"
#: The tables ``beside`` reads: (setting, protocol) in the order of the README.
MAIN_TABLES = (("in-domain", "slf"), ("transfer", "slf"), ("in-domain", "alf"), ("in-domain", "aff"))
#: The metrics it reads: clean accuracy and the board's headline (worst case over the suite at 0.032).
MAIN_METRICS = ("clean", "worst_case_Linf_0.032")
BESIDE = ("<!-- beside:begin -->", "<!-- beside:end -->")
COST = ("<!-- cost:begin -->", "<!-- cost:end -->")


def _verdict(c: dict[str, Any]) -> str:
    """The board's rule (:func:`.figures.established`), and why a difference cannot meet it."""
    if c["n_pairs"] < 2 or c["interval"] != "t over seeds":
        return "one seed: no seed interval"
    # the rule reads p_holm, interval, lo and hi: the JSON record's own fields
    return "established" if established(SimpleNamespace(**c)) else "not established"  # type: ignore[arg-type]


def _cell(c: dict[str, Any]) -> str:
    diff = fmt_diff(c["diff"], c["lo"], c["hi"])
    return f"{c['candidate']} {diff} ({p_text('Holm p', c['p_holm'])}; {_verdict(c)})"


def beside(data: dict[str, Any]) -> str:
    """A table from ``compare --baseline simclr --json``: per main table and metric, the trained
    families with the highest and the lowest difference to the baseline (the control left out)."""
    if data["baseline"] != BASELINE:
        raise UserError(f"beside: the comparisons are against {data['baseline']}, not {BASELINE}")
    protocols = data.get("protocols") or {}
    lines = [
        f"| setting | protocol | metric | highest Δ vs {BASELINE} | lowest Δ vs {BASELINE} |",
        "|---|---|---|---|---|",
    ]
    for setting, protocol in MAIN_TABLES:
        for metric in MAIN_METRICS:
            cs = [
                c
                for c in data["comparisons"]
                if c["setting"] == setting
                and protocols.get(c["protocol_id"], "slf") == protocol
                and c["metric"] == metric
                and c["candidate"] != CONTROL_LABEL
                and c["diff"] is not None
            ]
            if not cs:
                continue
            hi, lo = max(cs, key=lambda c: c["diff"]), min(cs, key=lambda c: c["diff"])
            label = cs[0]["metric_label"]
            lines.append(f"| {setting} | {protocol.upper()} | {label} | {_cell(hi)} | {_cell(lo)} |")
    legend = (
        f"Candidate minus {BASELINE} in points, the 95 % t-interval over seed pairs, McNemar's exact test "
        f"Holm-adjusted over all {data['n_tests']:,} tests of `compare --rows leaderboard --baseline "
        f"{BASELINE}`; established: Holm p < 0.05 and a seed interval excluding 0."
    )
    return "\n".join([*lines, "", textwrap.fill(legend, 100, break_on_hyphens=False)]) + "\n"


def _seconds(x: float) -> str:
    return f"{x:,.0f} s ({x / 3600:.1f} h)"


_THREADS = re.compile(r"\b(\d+) torch threads?\b")


def cores(record: Mapping[str, Any]) -> int:
    """The CPU cores a row or manifest held: the torch threads its ``device`` names (``cpu (x86_64,
    AVX512, 2 torch threads)``); 1 where it names none (a GPU, or a record without the field)."""
    m = _THREADS.search(str(record.get("device") or ""))
    return int(m.group(1)) if m else 1


def cost(manifests: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> str:
    """A table of what each stage cost in core-seconds (:func:`cores` times the wall seconds):
    training from the manifests' ``wall_s`` (a post-processed entry's apart: its ++ post-processing);
    each protocol's evaluation from its rows, per setting the probe's or the finetuning's
    ``probe_wall_s`` plus each attack row's ``wall_s`` (the worst-case rows only add up the others,
    so they are not counted), AutoAttack's rows apart."""
    # a ++ entry is not trained: its manifest's wall_s is its post-processing of a trained parent
    train = [cores(m) * float(m["wall_s"]) for m in manifests if not m.get("post")]
    post = [cores(m) * float(m["wall_s"]) for m in manifests if m.get("post")]
    lines = [
        "| stage | encoders | settings | core-seconds | of which AutoAttack | median per encoder |",
        "|---|---|---|---|---|---|",
        f"| training | {len(train)} | – | {_seconds(sum(train))} | – | {median(train):,.0f} s |",
    ]
    if post:
        lines.append(
            f"| ++ post-processing | {len(post)} | – | {_seconds(sum(post))} | – | {median(post):,.0f} s |"
        )
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        st = by.setdefault(protocol_name(r), {"fit": {}, "attack": 0.0, "aa": 0.0, "enc": {}})
        setting = (r["checkpoint_sha256"], r["dataset"])
        st["fit"][setting] = cores(r) * float(r.get("probe_wall_s") or 0.0)
        if r["attack"] != "worst_case":
            wall = cores(r) * float(r.get("wall_s") or 0.0)
            st["attack"] += wall
            st["aa"] += wall if r["attack"] == "autoattack" else 0.0
            st["enc"][r["checkpoint_sha256"]] = st["enc"].get(r["checkpoint_sha256"], 0.0) + wall
        st["enc"].setdefault(r["checkpoint_sha256"], 0.0)
    total = sum(train) + sum(post)
    for name in ("slf", "alf", "aff"):
        if name not in by:
            continue
        st = by[name]
        per_enc = dict(st["enc"])
        for (sha, _), fit in st["fit"].items():
            per_enc[sha] += fit
        spent = sum(per_enc.values())
        total += spent
        lines.append(
            f"| {name.upper()} evaluation | {len(per_enc)} | {len(st['fit'])} | {_seconds(spent)} | "
            f"{_seconds(st['aa'])} | {median(per_enc.values()):,.0f} s |"
        )
    if "label-free" in by:  # one measurement per encoder: every row of it records its whole time
        per_enc = {}
        for r in rows:
            if protocol_name(r) == "label-free":
                per_enc[r["checkpoint_sha256"]] = cores(r) * float(r.get("label_free_wall_s") or 0.0)
        spent = sum(per_enc.values())
        total += spent
        lines.append(
            f"| label-free evaluation | {len(per_enc)} | {len(per_enc)} | {_seconds(spent)} | – | "
            f"{median(per_enc.values()):,.0f} s |"
        )
    lines.append(f"| all | | | {_seconds(total)} | | |")
    hours = f"about {total / 2 / 3600:.1f} hours of wall time, had nothing else run"
    return "\n".join(lines) + f"\n\nOn two cores at once: {hours}.\n" + aa_split(rows)


AA_ORDER = ("apgd-ce", "apgd-t", "fab-t", "square", "apgd-dlr", "fab")


def _aa_row(st: dict[str, Any], r: Mapping[str, Any]) -> None:
    """Add one AutoAttack row to a stage's totals (``st``): per component the examples it decided,
    and its seconds and forwarded examples where the row records them."""
    names = [c for c in str(r.get("aa_components", "")).split(",") if c]
    split = bool(names) and f"aa_wall_s_{names[0].replace('-', '_')}" in r
    st["n"] += 1
    k = cores(r)
    st["old"] += 0.0 if split else k * float(r.get("wall_s") or 0.0)
    before, spent = int(r.get("n_clean_correct") or 0), 0.0
    for c in names:
        key = c.replace("-", "_")
        after = int(r[f"aa_n_robust_after_{key}"])
        st["d"][c] = st["d"].get(c, 0) + before - after
        before = after
        if split:
            st["s"][c] = st["s"].get(c, 0.0) + k * float(r[f"aa_wall_s_{key}"])
            st["f"][c] = st["f"].get(c, 0) + int(r[f"aa_forward_examples_{key}"])
            spent += k * float(r[f"aa_wall_s_{key}"])
    if split:
        st["rest"] = st.get("rest", 0.0) + k * float(r.get("wall_s") or 0.0) - spent


def aa_split(rows: Sequence[Mapping[str, Any]]) -> str:
    """AutoAttack per protocol split by component: the examples each decided, and its core-seconds
    and the examples it forwarded through the model from the rows' ``aa_wall_s_<c>`` /
    ``aa_forward_examples_<c>``; the time of rows written before those fields is counted apart."""
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["attack"] == "autoattack":
            _aa_row(by.setdefault(protocol_name(r), {"n": 0, "old": 0.0, "s": {}, "f": {}, "d": {}}), r)
    if not by:
        return ""
    comps = [c for c in AA_ORDER if any(c in st["d"] for st in by.values())]
    head = ["stage", "AutoAttack rows", "not split (rows before per-component times)"]
    lines = [
        "",
        "AutoAttack by component: examples decided; core-seconds and examples forwarded where the "
        "rows record them",
        "",
        "| " + " | ".join([*head, *comps, "rest (checks, clean and deciding forwards)"]) + " |",
        "|" + "---|" * (len(head) + len(comps) + 1),
    ]
    for name in ("slf", "alf", "aff"):
        if name not in by:
            continue
        st = by[name]
        cells = [
            f"{st['d'].get(c, 0):,} decided"
            + (f"; {st['s'][c]:,.0f} s, {st['f'][c]:,} forwarded" if c in st["s"] else "")
            for c in comps
        ]
        rest = f"{st['rest']:,.0f} s" if "rest" in st else "–"
        lines.append(
            f"| {name.upper()} | {st['n']} | {st['old']:,.0f} s | " + " | ".join([*cells, rest]) + " |"
        )
    return "\n".join(lines) + "\n"


def _claims(name: str) -> Callable[[Path, Path], str]:
    def make(board: Path, manifests: Path) -> str:
        from .claims import main_claims, reading

        return reading(json.loads(main_claims([board], name, output="json")))

    return make


def _headroom(board: Path, manifests: Path) -> str:
    from ..results.rows import load_rows
    from .headroom import headroom, headroom_markdown, pilot_markdown, read_manifests

    text = headroom_markdown(headroom(read_manifests(manifests), load_rows(board)))
    # the pilot runs that chose the budget say what more training of this encoder would give
    return text + ("\n" + pilot_markdown(board / "pilot") if (board / "pilot").is_dir() else "")


def _beside(board: Path, manifests: Path) -> str:
    from .compare import main_compare

    return beside(json.loads(main_compare([board], BASELINE, as_json=True)))


def _cost(board: Path, manifests: Path) -> str:
    from ..results.rows import load_rows
    from .headroom import read_manifests

    return cost(read_manifests(manifests), load_rows(board))


def _label_free(board: Path, manifests: Path) -> str:
    from ..results.rows import load_rows
    from .label_free import readme_section

    return readme_section(load_rows(board))


def sections() -> dict[tuple[str, str], Callable[[Path, Path], str]]:
    """(begin marker, end marker) -> the function making that section from (board, manifests)."""
    from . import claims, headroom, label_free

    return {
        claims.markers("nacl"): _claims("nacl"),
        claims.markers("robust-ssl"): _claims("robust-ssl"),
        (headroom.BEGIN, headroom.END): _headroom,
        BESIDE: _beside,
        COST: _cost,
        label_free.MARKERS: _label_free,
    }


def regenerate(board: str | Path, manifests: str | Path) -> str:
    """``board``/README.md with every generated section made again from ``board``'s rows and the
    checkpoint manifests under ``manifests``; the file itself is not written."""
    from ..results.rows import rows_read_once

    board, manifests = Path(board), Path(manifests)
    text = (board / "README.md").read_text()
    with rows_read_once():  # every section reads the same board
        for (begin, end), make in sections().items():
            text = splice_between(text, make(board, manifests), begin, end)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m robustbench_nacl.report.readme BOARD MANIFESTS``: rewrite BOARD/README.md."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(
            "usage: python -m robustbench_nacl.report.readme BOARD MANIFESTS (e.g. leaderboard "
            "robustbench_nacl/files/published/fashion-mnist/models)",
            file=sys.stderr,
        )
        return 2
    try:
        text = regenerate(*args)
    except UserError as e:
        print(f"readme: {e}", file=sys.stderr)
        return 2
    write_bytes_atomic(Path(args[0]) / "README.md", text.encode())
    print(f"rewrote the {len(sections())} generated sections of {Path(args[0]) / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
