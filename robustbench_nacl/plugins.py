"""Plugins: modules that register losses, encoders, attacks or datasets before a command runs.

A plugin is a module given by its dotted name (importable: installed, or on ``PYTHONPATH``), a
``.py`` file given by its path, or an installed package that declares an entry point in the group
:data:`ENTRY_POINT_GROUP`::

    [project.entry-points."robustbench_nacl.plugins"]
    my_plugin = "my_package.plugin"            # imported
    other = "my_package.plugin:register"       # imported, then register() is called

Importing a plugin runs its registrations (``robustbench_nacl.register_pair_loss``,
``register_encoder``, or ``ATTACKS``/``DATASETS``.register; examples/README.md shows each). A file is
imported under a module name made of its stem and the start of its sha256, compiled from the very
bytes that were hashed, so loading the same file twice is a no-op and a changed file is a
different plugin. Every loaded plugin is recorded by :func:`loaded_plugins` (module name,
installed version or None, sha256 of its source) for manifests, result rows and recipe identities
(docs/decisions.md, 'Plugins'). :func:`load_plugins` also writes the plugins it loaded into
:data:`ENV_VAR`, so that subprocesses and zoo workers, which call it too, load the same ones.

A plugin that cannot be found or fails to import, or that registers a name which exists, is a
one-line ``UserError`` naming the plugin and the cause.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import UserError, one_line
from .io import sha256_bytes

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "Plugin",
    "export_to_environ",
    "load_entry_point_plugins",
    "load_plugin",
    "load_plugins",
    "load_plugins_from_env",
    "loaded_plugins",
    "plugin_of",
]

#: the entry-point group an installed package declares to be loaded automatically
ENTRY_POINT_GROUP = "robustbench_nacl.plugins"
#: plugins (dotted names or file paths, separated by ``os.pathsep``) every process loads on start
ENV_VAR = "ROBUSTBENCH_NACL_PLUGINS"
#: prefix of the module name a plugin file is imported under
FILE_MODULE_PREFIX = "robustbench_nacl_plugin_"

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin: how it was named (``spec``) and what identifies its code."""

    spec: str  # a dotted name, an absolute file path, or "entry point NAME"
    module: str  # the module it was imported as
    version: str | None  # the installed distribution's version; None for a file or an uninstalled module
    sha256: str | None  # of the source file (a package: of all its .py files); None if it has none
    entry_point: bool = False

    def record(self) -> dict[str, Any]:
        """What manifests and rows record: module, version, sha256 (no path: it differs per machine)."""
        return {"module": self.module, "version": self.version, "sha256": self.sha256}


_LOADED: dict[str, Plugin] = {}  # module name -> plugin, in load order


def loaded_plugins() -> list[dict[str, Any]]:
    """``[{"module", "version", "sha256"}, ...]`` of every plugin loaded in this process, in load order."""
    return [p.record() for p in _LOADED.values()]


def plugin_of(module_name: str | None) -> Plugin | None:
    """The loaded plugin that defines module ``module_name`` (itself or a submodule of it), or None.

    ``register_*`` record the registering function's ``__module__``; this maps it to its plugin.
    """
    if not module_name:
        return None
    for p in _LOADED.values():
        if module_name == p.module or module_name.startswith(p.module + "."):
            return p
    return None


def load_plugin(spec: str) -> Plugin:
    """Import the plugin ``spec``: a dotted module name or a path to a ``.py`` file; idempotent."""
    text = str(spec).strip()
    if not text:
        raise UserError("--plugin needs a module name or a path to a .py file")
    if text.endswith(".py") or os.sep in text or "/" in text:
        return _load_file(text)
    if not _DOTTED.fullmatch(text):
        raise UserError(f"plugin {text!r} is neither a module name (pkg.module) nor a path to a .py file")
    return _load_module(text)


def load_entry_point_plugins() -> list[Plugin]:
    """Load every plugin installed packages declare in :data:`ENTRY_POINT_GROUP`, by entry-point name."""
    out = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.module in _LOADED:
            out.append(_LOADED[ep.module])
            continue
        spec = f"entry point {ep.name}"
        with _import_errors(spec, ep.module):
            obj = ep.load()
            if ep.attr is not None:
                if not callable(obj):
                    raise UserError(f"plugin {spec!r}: {ep.value} is not callable")
                obj()
        version = ep.dist.version if ep.dist is not None else _installed_version(ep.module)
        out.append(_record(Plugin(spec, ep.module, version, _source_sha256(sys.modules[ep.module]), True)))
    return out


def load_plugins_from_env(environ: dict[str, str] | None = None) -> list[Plugin]:
    """Load the plugins :data:`ENV_VAR` names (``os.pathsep``-separated), in order."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return [load_plugin(s) for s in value.split(os.pathsep) if s.strip()]


def load_plugins(specs: Iterable[str] = (), *, entry_points: bool = True) -> list[Plugin]:
    """What every command and worker runs first: entry-point plugins, :data:`ENV_VAR`'s, then ``specs``.

    Then :func:`export_to_environ`, so that every process started from this one loads the same.
    """
    loaded = load_entry_point_plugins() if entry_points else []
    loaded += load_plugins_from_env()
    loaded += [load_plugin(s) for s in specs]
    export_to_environ()
    return list(dict.fromkeys(loaded))


def export_to_environ() -> None:
    """Write the loaded plugins named by module or file into :data:`ENV_VAR` (entry points load anyway)."""
    specs = [p.spec for p in _LOADED.values() if not p.entry_point]
    if specs:
        os.environ[ENV_VAR] = os.pathsep.join(specs)


# ============ importing ============


def _record(plugin: Plugin) -> Plugin:
    _LOADED.setdefault(plugin.module, plugin)
    return _LOADED[plugin.module]


def _load_module(name: str) -> Plugin:
    if name in _LOADED:
        return _LOADED[name]
    with _import_errors(name, name):
        module = importlib.import_module(name)
    return _record(Plugin(name, name, _installed_version(name), _source_sha256(module)))


def _load_file(text: str) -> Plugin:
    path = Path(text).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"plugin {text!r}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
    if path.suffix != ".py":
        raise UserError(f"plugin {text!r}: a plugin file must be Python source ending in .py")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"plugin {text!r}: cannot read it ({e.strerror or e})") from None
    sha = sha256_bytes(data)
    name = f"{FILE_MODULE_PREFIX}{_identifier(path.stem)}_{sha[:16]}"
    if name in _LOADED:
        return _LOADED[name]
    with _import_errors(text, name):
        _exec_file(name, path, data)
    return _record(Plugin(str(path), name, None, sha))


def _exec_file(name: str, path: Path, data: bytes) -> ModuleType:
    """Run ``data`` (the bytes that were hashed, not a second read of ``path``) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        exec(compile(data, str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@contextlib.contextmanager
def _import_errors(spec: str, module: str) -> Iterator[None]:
    """Turn anything an import raises into one line naming the plugin (KeyboardInterrupt passes)."""
    try:
        yield
    except UserError as e:  # e.g. a name registered twice through register_pair_loss
        raise UserError(f"plugin {spec!r}: {e}") from None
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise UserError(
                f"plugin {spec!r} not found: no module named {e.name!r} (install it, add its folder to "
                "PYTHONPATH, or give the path of a .py file)"
            ) from None
        raise UserError(f"plugin {spec!r} failed to import: {one_line(e, 300, with_type=True)}") from None
    except (Exception, SystemExit) as e:
        raise UserError(f"plugin {spec!r} failed to import: {one_line(e, 300, with_type=True)}") from None


def _identifier(stem: str) -> str:
    return re.sub(r"\W", "_", stem) or "plugin"


# ============ identity ============


def _source_sha256(module: ModuleType) -> str | None:
    """sha256 of a module's source file; for a package, of every .py file under it (paths included)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    if getattr(module, "__path__", None) is None or path.name != "__init__.py":
        return _file_sha256(path)
    digest = hashlib.sha256()
    for f in sorted(path.parent.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        digest.update(f.relative_to(path.parent).as_posix().encode() + b"\0")
        digest.update(bytes.fromhex(_file_sha256(f) or "") + b"\n")
    return digest.hexdigest()


def _file_sha256(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except OSError:
        return None


def _installed_version(module: str) -> str | None:
    """The version of the installed distribution providing ``module``'s top-level package, or None."""
    dists = _distributions().get(module.split(".")[0], [])
    for dist in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    # scans every installed distribution's metadata once (tens of ms)
    return dict(importlib.metadata.packages_distributions())
