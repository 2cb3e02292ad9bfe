"""The shape of the code: short functions, no shadowed submodules, no pointers to missing documents."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import robustbench_nacl

PACKAGE = Path(robustbench_nacl.__file__).parent
ROOT = PACKAGE.parent
MAX_FUNCTION_LINES = 80


def _functions(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_library_function_is_over_80_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for p in sorted(PACKAGE.rglob("*.py"))
        for name, line, n in _functions(p)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


#: a module past about 500 lines holds more than one responsibility (docs/decisions.md,
#: 'Code layout'): split it before it grows past this
MAX_MODULE_LINES = 550


def test_no_library_module_is_over_550_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "modules over 550 lines (split them by responsibility):\n" + "\n".join(long)


def test_no_submodule_is_shadowed_by_a_package_attribute() -> None:
    shadowed = []
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="robustbench_nacl."):
        if info.name.endswith("__main__"):
            continue  # importing it runs the command line
        module = importlib.import_module(info.name)
        parent_name, _, attr = info.name.rpartition(".")
        parent = importlib.import_module(parent_name)
        if getattr(parent, attr, None) is not module:
            shadowed.append(f"{info.name} (the attribute is {type(getattr(parent, attr, None)).__name__})")
    assert not shadowed, "submodules shadowed by attributes of their package: " + ", ".join(shadowed)


def _shipped_text_files() -> list[Path]:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    return [*files, *ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "attacks").glob("*.toml")]


def test_every_document_named_ships_with_the_project() -> None:
    """A Markdown document named in code or docs exists in the repository, and nothing points
    outside it (`../`): the project must read and cite only what a clone of it contains."""
    named = re.compile(r"[\w./-]*\b[A-Za-z][\w-]*\.md\b")
    shipped = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {m.group(0)}"
        for p in _shipped_text_files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        for m in named.finditer(line)
        if m.group(0).startswith("../") or Path(m.group(0)).name not in shipped
    ]
    assert not hits, "documents named but not shipped: " + ", ".join(hits)


def test_no_numbered_decision_or_gotcha_of_an_outside_document() -> None:
    """Decisions are cited by their section in docs/decisions.md, not by an outside numbering."""
    pattern = re.compile(r"\bD\d{1,2}\b|\bgotcha\b")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _shipped_text_files()
        if p.name != "test_layout.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "decisions cited by an outside numbering: " + ", ".join(hits)


def test_docs_decisions_sections_named_in_code_exist() -> None:
    headings = {
        " ".join(m.group(1).split()).lower()
        for m in re.finditer(r"^#+ (.+)$", (ROOT / "docs" / "decisions.md").read_text(), re.M)
    }
    refs = re.compile(r"docs/decisions\.md,?\s*\n?\s*(?:#\s*)?['\"]([^'\"]+)['\"]")
    missing = sorted(
        f"{p.relative_to(ROOT)}: {m.group(1)!r}"
        for p in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
        for m in refs.finditer(p.read_text())
        if " ".join(m.group(1).split()).lower() not in headings
    )
    assert not missing, "docs/decisions.md has no section named: " + "; ".join(missing)
