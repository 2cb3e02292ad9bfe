"""Attack suites: TOML data files (``attacks/*.toml``) parsed into validated, hashable specs.

Schema (see ``attacks/README.md``)::

    name = "paper"                 # optional; defaults to the file name
    description = "..."            # optional

    [[attack]]
    name = "pgd"                   # registry name, or torchattacks.<Name>
    norm = "Linf"                  # Linf or L2 (default: the attack's first supported norm)
    eps = [0.002, "8/255"]         # [0,1] pixel units; "k/255" strings allowed
    steps = 10                     # any other key is an attack parameter
    step_size = 0.01
    restarts = 2

Every problem is a one-line ``UserError`` naming the file (and line, for malformed TOML).
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import canonical_json
from ..packaged import attacks_dir
from ..untrusted import read_regular
from .norms import NORMS
from .params import short_repr
from .runner import attack_info, resolve_attack
from .torchattacks_adapter import TORCHATTACKS_PREFIX, torchattacks_params

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ENV_DIR = "ROBUSTBENCH_NACL_ATTACKS"
REPO_SUITES_DIR = attacks_dir()  # the package's files/attacks (top-level attacks/ links to it)
TOP_LEVEL_KEYS = ("attack", "name", "description")
SPEC_KEYS = ("name", "norm", "eps")
# a key every attack takes: run it on the first N examples only (an expensive attack's fixed subset)
SUBSET = "subset"
# Largest meaningful eps per threat model: an Linf ball of radius 1 already contains every image.
EPS_MAX = {"Linf": 1.0, "L2": math.inf}
#: A suite file is a few kB of TOML: a larger one is no suite (and is not read whole).
MAX_SUITE = 1 << 20
_EPS_255 = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*255\s*$")


@dataclass(frozen=True)
class AttackSpec:
    """One ``[[attack]]`` entry: an attack, its threat model, its epsilons and its parameters."""

    name: str
    norm: str
    eps: tuple[float, ...]
    params: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-able form (what the suite hash is computed from)."""
        return {"name": self.name, "norm": self.norm, "eps": list(self.eps), "params": dict(self.params)}


@dataclass(frozen=True)
class Suite:
    """A validated attack suite; ``sha256`` identifies its content in result rows."""

    name: str
    attacks: tuple[AttackSpec, ...]
    sha256: str
    source: str = field(default="", compare=False)


def suite_dirs() -> list[Path]:
    """Where suite names are looked up: ``$ROBUSTBENCH_NACL_ATTACKS`` first, then the shipped ``attacks/``."""
    env = os.environ.get(ENV_DIR, "").strip()
    return [*([Path(env)] if env else []), REPO_SUITES_DIR]


def suite_names() -> list[str]:
    """Names of the available suite files (``*.toml`` stems), sorted."""
    return sorted({p.stem for d in suite_dirs() if d.is_dir() for p in d.glob("*.toml")})


def no_suites_error(suite: str | Path) -> UserError:
    """The one line for a suite name when no folder holds a suite file: where it looked, and why that
    is wrong (the named suites ship with robustbench-nacl: an installation without them is broken)."""
    looked = "; ".join(f"{d} ({'no *.toml files' if d.is_dir() else 'missing'})" for d in suite_dirs())
    return UserError(
        f"attack suite {str(suite)!r}: no suite files found, looked in {looked}; the named suites ship "
        f"with robustbench-nacl, so this installation lacks its suite folder: reinstall it, set ${ENV_DIR} "
        "to a folder of suite .toml files, or pass the path of one"
    )


def load_suite(suite: str | Path | Mapping[str, Any] | Suite) -> Suite:
    """A ``Suite`` from a suite name, a path to a ``.toml`` file, or the parsed structure as a dict."""
    if isinstance(suite, Suite):
        return suite
    if isinstance(suite, Mapping):
        return parse_suite_dict(suite, source="<dict>")
    if not isinstance(suite, (str, Path)):
        raise UserError(f"a suite is a name, a .toml path or a dict, not {type(suite).__name__}")
    path = Path(suite)
    looks_like_path = isinstance(suite, Path) or path.suffix == ".toml" or len(path.parts) > 1
    if not looks_like_path:
        for d in suite_dirs():
            if (d / f"{suite}.toml").is_file():
                path = d / f"{suite}.toml"
                break
        else:
            names = suite_names()
            if not names:
                raise no_suites_error(suite)
            raise UserError(f"unknown attack suite {str(suite)!r}; available: {', '.join(names)}")
    try:
        data = read_regular(path, "attack suite", MAX_SUITE)  # not a FIFO or /dev/zero
    except OSError as e:
        raise UserError(f"cannot read attack suite {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; attack suites are TOML files") from None
    return parse_suite_text(text, source=str(path), default_name=path.stem)


def parse_suite_text(text: str, *, source: str = "<string>", default_name: str = "custom") -> Suite:
    """Parse TOML text into a ``Suite``; malformed TOML is a UserError with the line number."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{source}: malformed TOML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise UserError(f"{source}: malformed TOML: nested too deeply") from None
    return parse_suite_dict(data, source=source, default_name=default_name)


def parse_suite_dict(
    data: Mapping[str, Any], *, source: str = "<dict>", default_name: str = "custom"
) -> Suite:
    """Validate the parsed structure (``{"attack": [{...}, ...]}``) into a ``Suite``."""
    if not isinstance(data, Mapping):
        raise UserError(f"{source}: a suite is a table with an [[attack]] array, not {type(data).__name__}")
    extra = [k for k in data if k not in TOP_LEVEL_KEYS]
    if extra:
        raise UserError(
            f"{source}: unknown top-level key(s) {', '.join(map(short_repr, extra))}; "
            f"allowed: {', '.join(TOP_LEVEL_KEYS)}"
        )
    if "attack" not in data:
        raise UserError(f"{source}: no [[attack]] table; a suite lists its attacks as [[attack]] entries")
    entries = data["attack"]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise UserError(f"{source}: 'attack' must be a non-empty array of tables ([[attack]] entries)")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"{source}: 'name' must be a non-empty string, got {short_repr(name)}")
    if not isinstance(data.get("description", ""), str):
        raise UserError(f"{source}: 'description' must be a string")
    try:
        specs = tuple(_parse_spec(e, f"{source}: attack #{i + 1}") for i, e in enumerate(entries))
    except UserError as e:  # names and keys from the file may hold newlines: the error stays one line
        raise UserError(" ".join(str(e).split())) from None
    digest = hashlib.sha256(canonical_json({"attack": [s.to_dict() for s in specs]}).encode()).hexdigest()
    return Suite(name=name, attacks=specs, sha256=digest, source=source)


def parse_eps(v: Any) -> float:
    """An epsilon as a float: a number, or a string ``"k/255"``."""
    if isinstance(v, str) and (m := _EPS_255.match(v)):
        return float(m.group(1)) / 255.0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"eps values are numbers or 'k/255' strings, got {short_repr(v)}")
    if not math.isfinite(v):
        raise ValueError(f"eps must be finite, got {short_repr(v)}")
    return float(v)


def _parse_spec(entry: Any, where: str) -> AttackSpec:
    if not isinstance(entry, Mapping):
        raise UserError(f"{where}: must be a table with name, norm and eps, got {short_repr(entry)}")
    bad_keys = [k for k in entry if not isinstance(k, str)]
    if bad_keys:
        raise UserError(f"{where}: keys must be strings, got {short_repr(bad_keys[0])}")
    name = entry.get("name")
    if not isinstance(name, str):
        raise UserError(
            f"{where}: 'name' (the attack) is required and must be a string, got {short_repr(name)}"
        )
    where = f"{where} ({name})"
    try:
        resolve_attack(name)
        info = attack_info(name)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    norm = entry.get("norm", info["norms"][0])
    if not isinstance(norm, str) or norm not in NORMS:  # a TOML array or table is unhashable
        raise UserError(f"{where}: unknown norm {short_repr(norm)}; valid norms: {', '.join(NORMS)}")
    if norm not in info["norms"]:
        raise UserError(f"{where}: does not support norm {norm}; it supports: {', '.join(info['norms'])}")
    eps = _parse_eps_list(entry.get("eps"), norm, where)
    raw = {k: v for k, v in entry.items() if k not in (*SPEC_KEYS, SUBSET)}
    params = _parse_params(name, info, raw, where)
    if SUBSET in entry:  # any attack: only the first N examples (kept in params: part of the rows' identity)
        n = entry[SUBSET]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(
                f"{where}: subset must be a whole number >= 1 (the first N examples), got {short_repr(n)}"
            )
        params[SUBSET] = n
    return AttackSpec(name=name, norm=norm, eps=eps, params=params)


def attack_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's parameters as its attack takes them (``subset`` is the benchmark's, not the attack's)."""
    return {k: v for k, v in params.items() if k != SUBSET}


def _parse_eps_list(raw: Any, norm: str, where: str) -> tuple[float, ...]:
    if raw is None:
        raise UserError(f"{where}: 'eps' is required (a list of epsilons in [0,1] pixel units)")
    values = raw if isinstance(raw, (list, tuple)) else [raw]
    if not values:
        raise UserError(f"{where}: 'eps' is empty; give at least one epsilon")
    try:
        eps = [parse_eps(v) for v in values]
    except ValueError as e:
        raise UserError(f"{where}: {e}") from None
    for e in eps:
        if e < 0 or e > EPS_MAX[norm]:
            bound = "[0, 1]" if math.isfinite(EPS_MAX[norm]) else ">= 0"
            raise UserError(
                f"{where}: eps {e:g} out of range for {norm}; it must be {bound} in [0,1] pixel units"
            )
    if len(set(eps)) != len(eps):
        raise UserError(f"{where}: duplicate eps values {short_repr(values)}")
    return tuple(eps)


def _json_value(v: Any) -> bool:
    """Plain TOML/JSON data only (no dates, no NaN), so that the suite hash is well defined."""
    if isinstance(v, (list, tuple)):
        return all(_json_value(x) for x in v)
    if isinstance(v, float):
        return math.isfinite(v)
    return v is None or isinstance(v, (str, int, bool))


def _parse_params(name: str, info: Mapping[str, Any], raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate extra keys: native attacks against their declared validators, torchattacks against
    the class constructor. Defaults are filled in so rows and hashes show the full configuration."""
    for k, v in raw.items():
        if not _json_value(v):
            raise UserError(
                f"{where}: {k} must be plain data (numbers, strings, booleans, lists), got {short_repr(v)}"
            )
    if name.startswith(TORCHATTACKS_PREFIX):
        accepted = torchattacks_params(name)
        defaults = {
            k: p.default
            for k, p in accepted.items()
            if p.default is not inspect.Parameter.empty and p.default is not None and _json_value(p.default)
        }
    else:
        accepted = info.get("params", {})
        sig = inspect.signature(resolve_attack(name)).parameters
        defaults = {
            k: sig[k].default
            for k in accepted
            if k in sig and sig[k].default not in (None, inspect.Parameter.empty)
        }
    unknown = [k for k in raw if k not in accepted]
    if unknown:
        allowed = ", ".join([*SPEC_KEYS, SUBSET, *accepted])
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    params = dict(defaults)
    validators = info.get("params") or {}
    for k, v in raw.items():
        try:
            params[k] = validators[k](v) if k in validators else (list(v) if isinstance(v, tuple) else v)
        except ValueError as e:
            raise UserError(f"{where}: {k} {e}") from None
    check = info.get("check_params")
    if check is not None:
        try:
            check(params)
        except ValueError as e:
            raise UserError(f"{where}: {e}") from None
    return params
