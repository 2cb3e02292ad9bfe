"""The documentation hand steps after finish.sh and finish_hand.py (reference-run/README.md): the
main README's workflow 4 and "Published models" from the drafts here, docs/decisions.md's
"Published models" paragraph (with the published sizes) and "Reference leaderboard" (the pilot's
new place, no regeneration in progress), and the CHANGELOG line that named reference-run/. Run from
the repository root; the one FILL left (workflow 4's rank) comes from the leaderboard command."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

SET = Path("robustbench_nacl/files/published/fashion-mnist")
RUN = Path("reference-run")


def between(text: str, start: str, stop: str, new: str) -> str:
    """Replace text[start:stop) (start included, stop kept); each marker must occur once."""
    assert text.count(start) == 1 and text.count(stop) == 1, (start, stop)
    i, j = text.index(start), text.index(stop)
    assert i < j
    return text[:i] + new + text[j:]


def sub_once(pattern: str, new: str, text: str) -> str:
    """re.sub that must match exactly once (whitespace in the pattern matches any run of it)."""
    pattern = r"\s+".join(map(re.escape, pattern.split()))
    out, n = re.subn(pattern, lambda _: new, text)
    assert n == 1, (pattern, n)
    return out


size = sum(p.stat().st_size for p in SET.rglob("*") if p.is_file())
weights = sum(p.stat().st_size for p in (SET / "models").glob("*/weights.safetensors"))
n_models = len(list((SET / "models").glob("*/weights.safetensors")))

# the main README
readme = Path("README.md")
text = readme.read_text()
wf4 = (RUN / "main-README-workflow4.md").read_text().rstrip("\n") + "\n\n"
text = between(text, "### 4. Your checkpoint against the reference leaderboard", "### 5. ", wf4)
published = (RUN / "main-README-published.md").read_text().rstrip("\n") + "\n\n"
text = between(text, "The demo zoo ships trained: 16 encoders", "Weights load as safetensors", published)
readme.write_text(text)

# docs/decisions.md
decisions = Path("docs/decisions.md")
text = decisions.read_text()
draft = (RUN / "decisions-published.md").read_text().split("\n\n", 1)[1].strip()
draft = sub_once(
    "published by `reference-run/finish.sh` with `zoo publish --zoo fashion-mnist` once every entry's "
    "rows were in.",
    "published with `zoo publish --zoo fashion-mnist` once every entry's rows were in.",
    draft,
)
assert draft.count("WEIGHTS MB") == 1 and draft.count("SET MB") == 1
draft = draft.replace("60 encoders", f"{n_models} encoders")
draft = draft.replace("WEIGHTS MB", f"{weights / 1e6:.1f} MB").replace("SET MB", f"{size / 1e6:.1f} MB")
anchor = "Weights come from the package, a local folder"
assert text.count(anchor) == 1
draft = textwrap.fill(" ".join(draft.split()), width=100, break_long_words=False, break_on_hyphens=False)
text = text.replace(anchor, draft + "\n\n" + anchor)
text = sub_once(
    "While a regeneration runs over several sessions, its checkpoints and rows land in `reference-run/` "
    "(its README says how far it is) and `leaderboard/` keeps the last complete board.",
    "The regeneration ran over several working sessions, each resuming where the last\n"
    "stopped, with its rows committed as they landed; `leaderboard/README.md` gives each stage's cost.",
    text,
)
text = sub_once("`reference-run/pilot/`", "`leaderboard/pilot/`", text)
decisions.write_text(text)

# CHANGELOG: the folder it named is gone
changelog = Path("CHANGELOG.md")
text = changelog.read_text()
text = sub_once(
    "for seed 0), regenerating in `reference-run/`.", "for seed 0), regenerated into `leaderboard/`.", text
)
changelog.write_text(text)

print(
    f"README workflow 4 and Published models; decisions: {n_models} encoders, weights "
    f"{weights / 1e6:.1f} MB, the set {size / 1e6:.1f} MB"
)
