"""The reference leaderboard README's generated sections, so that no number in its reading is typed
by hand (docs/decisions.md, "Reference leaderboard"):

- ``claims`` and ``claims:robust-ssl``: the readings of the two shipped claims files
  (:func:`.claims.reading` of ``compare --claims NAME --json``);
- ``targets``: the training targets, from the checkpoints' manifests and the rows (:mod:`.targets`);
- ``beside``: beside the claims, the families furthest above and below SimCLR in the main tables,
  from ``compare --baseline simclr --json`` (:func:`beside`).

``python -m robustbench_nacl.report.readme BOARD MANIFESTS`` rewrites each section of
``BOARD/README.md`` between its markers, atomically; the tests regenerate each section from the
committed rows and compare.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import write_bytes_atomic
from .aggregate import CONTROL_LABEL
from .fmt import fmt_diff, fmt_p
from .fmt import splice as splice_between

BASELINE = "simclr"
#: The tables ``beside`` reads: (setting, protocol) in the order of the README.
MAIN_TABLES = (("in-domain", "slf"), ("transfer", "slf"), ("in-domain", "alf"), ("in-domain", "aff"))
#: The metrics it reads: clean accuracy and the board's headline (worst case over the suite at 0.032).
MAIN_METRICS = ("clean", "worst_case_Linf_0.032")
ALPHA = 0.05
BESIDE = ("<!-- beside:begin -->", "<!-- beside:end -->")


def _verdict(c: dict[str, Any]) -> str:
    """The board's rule: Holm p < 0.05 and a seed interval excluding 0."""
    if c["n_pairs"] < 2 or c["interval"] != "t over seeds":
        return "one seed: no seed interval"
    significant = c["p_holm"] is not None and c["p_holm"] < ALPHA
    excludes = c["lo"] is not None and c["hi"] is not None and (c["lo"] > 0 or c["hi"] < 0)
    return "established" if significant and excludes else "not established"


def _cell(c: dict[str, Any]) -> str:
    p = fmt_p(c["p_holm"])
    holm = f"Holm p {'< ' + p[1:] if p.startswith('<') else '= ' + p}"
    return f"{c['candidate']} {fmt_diff(c['diff'], c['lo'], c['hi'])} ({holm}; {_verdict(c)})"


def beside(data: dict[str, Any]) -> str:
    """A table from ``compare --baseline simclr --json``: per main table and metric, the trained
    family furthest above the baseline and the one furthest below (the control left out)."""
    if data["baseline"] != BASELINE:
        raise UserError(f"beside: the comparisons are against {data['baseline']}, not {BASELINE}")
    protocols = data.get("protocols") or {}
    lines = [
        f"| setting | protocol | metric | furthest above {BASELINE} | furthest below {BASELINE} |",
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
    return "\n".join([*lines, "", legend]) + "\n"


def _claims(name: str) -> Callable[[Path, Path], str]:
    def make(board: Path, manifests: Path) -> str:
        from .claims import main_claims, reading

        return reading(json.loads(main_claims([board], name, output="json")))

    return make


def _targets(board: Path, manifests: Path) -> str:
    from ..results.rows import load_rows
    from .targets import read_manifests, targets, targets_markdown

    return targets_markdown(targets(read_manifests(manifests), load_rows(board)))


def _beside(board: Path, manifests: Path) -> str:
    from .compare import main_compare

    return beside(json.loads(main_compare([board], BASELINE, as_json=True)))


def sections() -> dict[tuple[str, str], Callable[[Path, Path], str]]:
    """(begin marker, end marker) -> the function making that section from (board, manifests)."""
    from . import claims, targets

    return {
        claims.markers("nacl"): _claims("nacl"),
        claims.markers("robust-ssl"): _claims("robust-ssl"),
        (targets.BEGIN, targets.END): _targets,
        BESIDE: _beside,
    }


def regenerate(board: str | Path, manifests: str | Path) -> str:
    """``board``/README.md with every generated section made again from ``board``'s rows and the
    checkpoint manifests under ``manifests``; the file itself is not written."""
    board, manifests = Path(board), Path(manifests)
    text = (board / "README.md").read_text()
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
