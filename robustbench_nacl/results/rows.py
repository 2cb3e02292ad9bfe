"""Result rows: the only thing that leaves an evaluation (typed, validated, content-addressed; no torch).

A row is a :class:`ResultRow`: typed required fields plus free-form provenance (``extra``). On disk
it is one flat JSON object per file (``ResultRow.to_json``), content-addressed by the fields that
determine its numbers and written atomically, so re-running an evaluation whose rows exist is a
no-op and any number of workers can write into one directory without coordination.

Every row names what was trained and how it was measured (see docs/decisions.md, 'Result rows,
recipes and protocols'):

- ``recipe_id``: a hash of the training recipe (the full training configuration minus the seed;
  for a checkpoint not written by ``train``, its weights' sha256). Rows of one recipe are seeds of
  one leaderboard line; rows of different recipes never are.
- ``protocol_id``: a hash of the evaluation protocol (:func:`protocol_of`). Rows of different
  protocols are never ranked in one table.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..io import atomic_open, canonical_json, write_bytes_atomic, write_json_atomic
from ..untrusted import gunzip_bounded, read_regular, safe_name

ROWS_DIR = "rows"
#: A row pack: many rows in one gzipped JSON-lines file, which ``load_rows`` reads beside (or instead
#: of) the ``rows/`` folder. Published sets ship their rows this way (a tenth of the bytes of one file
#: per row, and one file in the wheel instead of thousands).
ROW_PACK = "rows.jsonl.gz"
#: Version of the on-disk row layout; rows without recipe_id/protocol_id are format 1.
ROW_FORMAT = 2
#: The largest row file read (a row is a few kB; its per-example bits grow by 1 kB per 4,000 examples).
MAX_ROW_FILE = 16 << 20
# probe_underfit fires when the probe's train accuracy is more than this below the kNN accuracy on
# the same features (docs/decisions.md, 'Sanity checks'): about 3 seed-to-seed SDs of the reference.
# Here, not in eval/sanity.py, because the torch-free renderer reads rows against it too.
PROBE_UNDERFIT_GAP = 0.10
SETTINGS = ("in-domain", "transfer", "shift", "corruption")
# Loss parameters shown as a recipe's "key parameters" (the ``key_params`` display column) when they
# differ from SimCLR's defaults. Display only: recipes are told apart by recipe_id.
KEY_PARAMS = (
    "G1",
    "M",
    "lam",
    "combine",
    "positives",
    "alpha",
    "G2",
    "w",
    "tau_plus",
    "beta",
    "t",
    "views",
    "m_views",
    "mix_alpha",
    "noise_scale",
)

# The fields that determine a row's numbers (its content address); everything else is provenance.
IDENTITY = (
    "checkpoint_sha256",
    "setting",
    "dataset",
    "attack",
    "norm",
    "attack_params",
    "eps",
    "seed",
    "n_examples",
    "probe_config",
    "suite_sha256",
    "attack_versions",
)
#: The finetuning protocol's settings (eval/finetune.py): an identity field only for ALF and AFF rows.
FINETUNE = "finetune"
# Identity fields only some rows have (corruption rows, those read from a released corruption set,
# ALF/AFF rows): part of the id where present,
# so that every other row (SLF, the other settings) keeps the id it always had.
#: The class of device a row was computed on (utils.device_class): absent on a CPU, so that every CPU
#: row keeps its id, and a GPU's row never stands for a CPU's of the same settings (or the reverse).
DEVICE_CLASS = "device_class"
OPTIONAL_IDENTITY = ("corruption", "severity", "corruption_source", FINETUNE, DEVICE_CLASS)


def _hash(obj: Any, n: int = 24) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def row_id(identity: Mapping[str, Any]) -> str:
    """The content address: sha256 of the canonical JSON of the identity fields."""
    missing = [k for k in IDENTITY if k not in identity]
    if missing:
        raise ValueError(f"row identity lacks {missing}")
    # default=str: legacy identities may hold non-JSON values; new rows are plain JSON already
    fields = {k: identity[k] for k in IDENTITY}
    fields |= {k: identity[k] for k in OPTIONAL_IDENTITY if identity.get(k) is not None}
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:24]


def recipe_id(recipe: Mapping[str, Any]) -> str:
    """The recipe's id: a hash of its canonical JSON (the recipe never holds the seed)."""
    return _hash(dict(recipe), 16)


def protocol_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """What must be equal for two rows to be ranked in one table (see docs/decisions.md,
    'Result rows, recipes and protocols'). The probe seed is not part of it: seeds are runs."""
    probe = {k: v for k, v in dict(row["probe_config"]).items() if k != "seed"}
    out = {
        "dataset": row["dataset"],
        "setting": row["setting"],
        "suite_sha256": row["suite_sha256"],
        "probe": probe,
        "n_examples": row["n_examples"],
        "attack_versions": dict(row["attack_versions"]),
        # corruption rows, ALF/AFF rows and their settings; the others (no such keys) hash as before.
        # Not the device class: rows of a CPU and a GPU measure the same protocol and rank together,
        # each showing where it was computed
        **{k: row[k] for k in OPTIONAL_IDENTITY if row.get(k) is not None and k != DEVICE_CLASS},
    }
    return out


def protocol_name(row: Mapping[str, Any]) -> str:
    """The row's finetuning protocol: ``slf`` (no ``finetune`` field), ``alf`` or ``aff``."""
    ft = row.get(FINETUNE)
    return str(ft.get("protocol", "?")) if isinstance(ft, Mapping) else "slf"


def protocol_id(row: Mapping[str, Any]) -> str:
    """The hash of :func:`protocol_of`."""
    return protocol_hash(protocol_of(row))


def protocol_hash(protocol: Mapping[str, Any]) -> str:
    """The id of a protocol (a :func:`protocol_of` dict)."""
    return _hash(dict(protocol), 16)


def stamp_ids(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with ``recipe_id``, ``protocol_id`` and ``row_id`` computed from its own fields."""
    out = dict(data)
    out["recipe_id"] = recipe_id(out["recipe"])
    out["protocol_id"] = protocol_id(out)
    out["row_id"] = row_id(out)
    return out


class LegacyRowError(UserError):
    """A row written before rows carried recipe and protocol ids (format 1)."""


_STR = ("row_id", "recipe_id", "protocol_id", "checkpoint_id", "checkpoint_sha256", "encoder", "loss")
_STR += ("key_params", "setting", "dataset", "attack", "norm", "suite_sha256")
_DICT = ("attack_params", "probe_config", "attack_versions", "recipe")


@dataclass(frozen=True, eq=False)
class ResultRow(Mapping[str, Any]):
    """One measured number with everything that identifies it; reads like the flat JSON dict.

    ``row["clean_acc"]``, ``row.get("shift")``, ``dict(row)`` and ``row == json_dict`` all work;
    the typed fields are the required keys (:data:`REQUIRED`), ``extra`` holds the rest
    (provenance, per-attack details, ``sanity_*`` flags, ``robust_bits``/``clean_bits``).
    """

    row_format: int
    row_id: str
    recipe_id: str
    protocol_id: str
    checkpoint_id: str
    checkpoint_sha256: str
    encoder: str
    loss: str
    key_params: str  # display only: the recipe's loss parameters that differ from SimCLR's
    control: bool
    pretrain_dataset: str | None
    setting: str
    dataset: str  # canonical spec (data.spec.canonical_spec)
    attack: str
    norm: str
    eps: float
    seed: int
    n_examples: int | None  # requested (None: every test example)
    n_examples_evaluated: int
    clean_acc: float
    robust_acc: float
    sanity_ok: bool
    suite_sha256: str
    attack_params: dict[str, Any]
    probe_config: dict[str, Any]
    attack_versions: dict[str, Any]
    recipe: dict[str, Any]  # what recipe_id hashes
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- Mapping: the flat JSON view ----

    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            return getattr(self, key)
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        yield from _FIELDS
        yield from self.extra

    def __len__(self) -> int:
        return len(_FIELDS) + len(self.extra)

    def __repr__(self) -> str:
        what = f"{self.checkpoint_id} {self.setting} {self.dataset} {self.attack} {self.eps:g}"
        return f"ResultRow({self.row_id}: {what})"

    def to_json(self) -> dict[str, Any]:
        """The flat JSON object stored on disk."""
        return {**{k: getattr(self, k) for k in _FIELDS}, **self.extra}

    @property
    def protocol(self) -> dict[str, Any]:
        """The evaluation protocol this row was measured under (:func:`protocol_of`)."""
        return protocol_of(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str | Path | None = None) -> ResultRow:
        """Validate a flat row and type it; every problem is a one-line ``UserError`` naming the row."""
        if isinstance(data, ResultRow):
            return data
        where = _where(data, source)
        if not isinstance(data, Mapping):
            raise UserError(f"{where} is not a JSON object")
        if _is_legacy(data):
            raise LegacyRowError(_legacy_message(where, data))
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise UserError(f"{where} lacks required key(s) {', '.join(missing)}")
        _check_types(data, where)
        _check_measurement(data, where)
        _check_ids(data, where)
        typed = {k: data[k] for k in _FIELDS}
        return cls(**typed, extra={k: v for k, v in data.items() if k not in _FIELDS})


_FIELDS = tuple(f.name for f in fields(ResultRow) if f.name != "extra")
#: Every key a row must carry: the typed fields of ResultRow, spelled out once (there).
REQUIRED = _FIELDS
#: The required keys that are not part of the identity (results and ids).
RESULT_KEYS = tuple(k for k in REQUIRED if k not in IDENTITY)


def _where(data: Any, source: str | Path | None) -> str:
    at = f" in {source}" if source else ""
    rid = data.get("row_id") if isinstance(data, Mapping) else None
    if rid:
        return f"result row {rid}{at}"
    ckpt = data.get("checkpoint_id") if isinstance(data, Mapping) else None
    return f"result row{at} (checkpoint_id={ckpt!r})"


def _legacy_message(where: str, data: Mapping[str, Any]) -> str:
    ckpt = data.get("checkpoint") or data.get("checkpoint_id") or "CHECKPOINT"
    return (
        f"{where} was written by an older robustbench-nacl (no recipe_id/protocol_id, so different "
        f"training recipes and evaluation protocols cannot be told apart); re-run "
        f"`robustbench-nacl eval {ckpt} --out NEW_DIR` (and the same for every other checkpoint of "
        "that directory) and render the leaderboard from NEW_DIR"
    )


def _is_legacy(data: Mapping[str, Any]) -> bool:
    return not any(k in data for k in ("row_format", "recipe_id", "protocol_id"))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_types(d: Mapping[str, Any], where: str) -> None:
    if d["row_format"] != ROW_FORMAT:
        raise UserError(f"{where}: row_format {d['row_format']!r} is not {ROW_FORMAT}; re-run its evaluation")
    for k in ("eps", "clean_acc", "robust_acc"):
        if not _is_number(d[k]):
            raise UserError(f"{where}: {k} must be a finite number, got {d[k]!r}")
    for k in ("clean_acc", "robust_acc"):
        if not 0.0 <= d[k] <= 1.0:
            raise UserError(f"{where}: {k} must lie in [0, 1], got {d[k]!r}")
    if d["setting"] not in SETTINGS:
        raise UserError(f"{where}: unknown setting {d['setting']!r}; valid: {', '.join(SETTINGS)}")
    for k in ("control", "sanity_ok"):
        if not isinstance(d[k], bool):
            raise UserError(f"{where}: {k} must be true or false, got {d[k]!r}")
    for k in _STR:
        if not isinstance(d[k], str):
            raise UserError(f"{where}: {k} must be a string, got {d[k]!r}")
    if d["pretrain_dataset"] is not None and not isinstance(d["pretrain_dataset"], str):
        raise UserError(f"{where}: pretrain_dataset must be a string or null, got {d['pretrain_dataset']!r}")
    ints = {"seed": d["seed"], "n_examples_evaluated": d["n_examples_evaluated"]}
    if d["n_examples"] is not None:
        ints["n_examples"] = d["n_examples"]
    for k, v in ints.items():
        if not _is_int(v):
            raise UserError(f"{where}: {k} must be an integer, got {v!r}")
    for k in _DICT:
        if not isinstance(d[k], Mapping):
            raise UserError(f"{where}: {k} must be a JSON object, got {d[k]!r}")
    if d.get(FINETUNE) is not None and not isinstance(d[FINETUNE], Mapping):
        raise UserError(f"{where}: {FINETUNE} must be a JSON object or absent, got {d[FINETUNE]!r}")


def _check_measurement(d: Mapping[str, Any], where: str) -> None:
    """Refuse a row that cannot be a measurement: no example evaluated (its accuracies are of
    nothing, and would rank anywhere), a request of no or of more examples than any test set has, or
    robust above clean accuracy (an attack never makes a wrong prediction right; docs/decisions.md,
    'Untrusted input: names, bounds and refusals')."""
    n, asked = d["n_examples_evaluated"], d["n_examples"]
    if not 1 <= n < 1 << 40:
        raise UserError(f"{where}: n_examples_evaluated {n!r} is not a count of evaluated examples (>= 1)")
    if asked is not None and not 1 <= asked < 1 << 40:
        raise UserError(f"{where}: n_examples {asked!r} is not a number of examples to evaluate (>= 1)")
    if d["robust_acc"] > d["clean_acc"] + 1e-9:
        raise UserError(
            f"{where}: robust accuracy {d['robust_acc']!r} above clean accuracy {d['clean_acc']!r} is no "
            "measurement (an attacked example counts only if it was classified right clean)"
        )


def _check_ids(d: Mapping[str, Any], where: str) -> None:
    # the ids are hashes of the row's own fields: a mismatch means the file was edited or corrupted.
    # The row id is checked too: it names the row's file (a forged one could name any path)
    safe_name(d["row_id"], f"{where}: row_id")
    for name, want in (
        ("recipe_id", recipe_id(d["recipe"])),
        ("protocol_id", protocol_id(d)),
        ("row_id", row_id(d)),
    ):
        if d[name] != want:
            raise UserError(
                f"{where}: {name} {d[name]!r} does not match its fields ({want}); the row was edited or "
                "is corrupt: delete it and re-run its evaluation"
            )


def row_path(out: str | Path, rid: str) -> Path:
    """Where the row with this id lives under an output directory (the id must be a plain name)."""
    return Path(out) / ROWS_DIR / f"{safe_name(rid, 'row_id')}.json"


#: Fault-injection hook (tests/test_fault_injection.py): a file path. A row write with that variable
#: set stops with its temporary file written but not yet renamed, creates the file, and waits to be
#: killed, so that the test's kill lands inside a row write every time (a poll for the temporary
#: could miss the few milliseconds it exists). Unset, as for every user, it costs one lookup.
HOLD_ROW_WRITE_ENV = "ROBUSTBENCH_NACL_TEST_HOLD_ROW_WRITE"


def write_row(out: str | Path, row: ResultRow) -> Path:
    """Write one row atomically at its content address; returns the path."""
    path = row_path(out, row.row_id)
    if hold := os.environ.get(HOLD_ROW_WRITE_ENV):
        with atomic_open(path, "wb") as f:
            f.write((json.dumps(row.to_json(), indent=2) + "\n").encode())
            f.flush()
            Path(hold).touch()
            time.sleep(600)  # the test kills the process here; if it does not, the write completes
        return path
    write_json_atomic(path, row.to_json())
    return path


def read_row(path: str | Path) -> dict[str, Any]:
    """Parse one row file into its raw JSON object (a one-line UserError if it is not one)."""
    try:
        row = json.loads(read_regular(path, "result row", MAX_ROW_FILE))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
        raise UserError(f"cannot read result row {path}: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(row, dict):
        raise UserError(f"result row {path} is not a JSON object")
    return row


def read_valid_row(path: str | Path, rid: str) -> ResultRow | None:
    """The row stored at ``path`` if it is complete, current and is the row ``rid``; None if it is
    missing, unreadable, truncated, legacy or foreign (such a row is recomputed, never trusted)."""
    try:
        row = ResultRow.from_json(read_row(path), source=path)
    except UserError:
        return None
    return row if row.row_id == rid and row_id(row) == rid else None


def valid_pack_rows(path: str | Path) -> list[ResultRow]:
    """The rows of the row pack at ``path`` that are complete, current and match their ids (none if
    there is no pack; a damaged pack or row counts as nothing: its rows are recomputed)."""
    if not Path(path).is_file():
        return []
    try:
        raw = read_row_pack(path)
    except UserError:
        return []
    out = []
    for r in raw:
        try:
            row = ResultRow.from_json(r, source=path)
        except UserError:
            continue
        if row_id(row) == row.row_id:
            out.append(row)
    return out


def write_row_pack(directory: str | Path, rows: list[ResultRow]) -> Path:
    """Write ``rows`` as one row pack (:data:`ROW_PACK`) in ``directory``, atomically; returns its path.

    One canonical JSON object per line, sorted by row id, gzip with no timestamp: the same rows make
    the same bytes, so a re-published set is a no-op for git.
    """
    lines = sorted(canonical_json(r.to_json()) for r in {r.row_id: r for r in rows}.values())
    path = Path(directory) / ROW_PACK
    write_bytes_atomic(path, gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9, mtime=0))
    return path


def read_row_pack(path: str | Path) -> list[dict[str, Any]]:
    """The raw JSON objects of a row pack (a one-line UserError if it is damaged)."""
    try:
        # inflated up to a cap, never whole: a few MB of gzip can hold many GB of zeros
        text = gunzip_bounded(read_regular(path, "row pack"), what=f"row pack {path}").decode()
        raw = [json.loads(line) for line in text.splitlines() if line]
    except (OSError, EOFError, ValueError, RecursionError, zlib.error) as e:
        raise UserError(f"cannot read row pack {path}: {' '.join(str(e).split())[:200]}") from None
    if not all(isinstance(r, dict) for r in raw):
        raise UserError(f"row pack {path} holds a line that is not a JSON object")
    return raw


# directory -> its rows, while a `rows_read_once()` block runs (None outside one)
_READ_ONCE: ContextVar[dict[Path, list[ResultRow]] | None] = ContextVar("rows_read_once", default=None)


@contextmanager
def rows_read_once() -> Iterator[None]:
    """Within the block, ``load_rows`` reads and validates each directory once.

    For a report that reads one board several times (the leaderboard README's sections each load
    the board's 14,000 rows; reading and checking them was half its cost). Rows are immutable, so
    the readers share them; each gets its own list. Outside the block every call reads the files.
    """
    token = _READ_ONCE.set({})
    try:
        yield
    finally:
        _READ_ONCE.reset(token)


def load_rows(directory: str | Path) -> list[ResultRow]:
    """Every row under ``directory`` (its ``rows/`` subfolder if present, and its row pack if it has
    one), validated, in a stable order.

    Rows written before rows carried recipe and protocol ids fail with one line saying how to
    re-run their evaluations.
    """
    read = _READ_ONCE.get()
    if read is None:
        return _load_rows(Path(directory))
    key = Path(directory).resolve()  # one folder however it is spelt
    if key not in read:
        read[key] = _load_rows(Path(directory))  # as given: its messages and rows' source name it so
    return list(read[key])


def _load_rows(d: Path) -> list[ResultRow]:
    if d.exists() and not d.is_dir():
        raise UserError(f"{d} is a file, not a rows directory: pass the --out folder of `eval` (its rows/)")
    if not d.is_dir():
        raise UserError(f"rows directory {d} does not exist; run `robustbench-nacl eval ... --out {d}` first")
    base = d / ROWS_DIR if (d / ROWS_DIR).is_dir() else d
    pack = d / ROW_PACK
    # beside a pack, the folder's own *.json files are the set's other files (coverage.json), not rows
    files = sorted(base.glob("*.json")) if base != d or not pack.is_file() else []
    raw: list[tuple[Path, dict[str, Any]]] = [(p, read_row(p)) for p in files]
    if pack.is_file():
        raw += [(pack, r) for r in read_row_pack(pack)]
    legacy = [
        (p, r) for p, r in raw if "recipe_id" not in r and "protocol_id" not in r and "row_format" not in r
    ]
    if legacy:
        ckpts = sorted({str(r.get("checkpoint") or r.get("checkpoint_id")) for _, r in legacy})
        raise LegacyRowError(
            f"{len(legacy)} of {len(raw)} result rows in {base} were written by an older robustbench-nacl "
            "(no recipe_id/protocol_id, so different training recipes and evaluation protocols cannot be "
            f"told apart); re-run `robustbench-nacl eval CHECKPOINT --out NEW_DIR` for "
            f"{len(ckpts)} checkpoint(s) ({', '.join(ckpts[:3])}{', ...' if len(ckpts) > 3 else ''}) "
            "and render the leaderboard from NEW_DIR"
        )
    # a row in both the folder and the pack is one row (rows are content-addressed)
    rows = {r.row_id: r for r in (ResultRow.from_json(r, source=base) for _, r in raw)}
    return sorted(rows.values(), key=_order)


def _order(r: ResultRow) -> tuple:
    return (r.checkpoint_id, r.setting, r.dataset, r.attack, r.eps, r.row_id)
