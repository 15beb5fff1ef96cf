"""The start-up hook that puts a kernel into a served model: copied into a hook folder, never imported by magpie.

It runs in the engine's own interpreter, which may not have magpie installed (a docker image), so it imports
nothing of magpie. `replacement.write_hook` puts this file beside a plan (`magpie_replacement.json`), a
`sitecustomize.py` that calls `install()` (Python runs it at every interpreter start of a process whose
PYTHONPATH holds the folder: the server, and the processes it spawns, which inherit that variable) and a
distribution's metadata whose `vllm.general_plugins` entry point is `install` (vLLM calls it in each of its
processes). For each replacement of the plan, `install()` patches the target once its module is imported
(a finder on `sys.meta_path`: processes that never import it pay nothing) and writes a record into the
plan's records folder: `<pid>.installed.json` once patched, `<pid>.called.json` at the replacement's first
call, `<pid>.failed.json` where the target or the implementation could not be found. The runner reads them.
`check()` (`python -c "import magpie_replacement_hook as h; h.check()"`) resolves every target and
implementation in a fresh process before any server starts: a target that does not exist is one line, exit 2.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import threading

PLAN = "magpie_replacement.json"


def _plan() -> dict:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), PLAN)) as f:
        return json.load(f)


def _write_record(folder: str, kind: str, data: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{os.getpid()}.{kind}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "argv": sys.argv[:3], **data}, f)
    os.replace(tmp, path)


def _split_target(target: str) -> tuple[str, list[str]]:
    """`module:Qual.name` as given, else the longest importable dotted prefix is the module."""
    if ":" in target:
        module, qualname = target.split(":", 1)
        return module, qualname.split(".")
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is not None:
            return name, parts[cut:]
    raise LookupError(f"no module of {target!r} can be imported")


def _owner_and_name(module, qualname: list[str], target: str):
    owner = module
    for part in qualname[:-1]:
        if not hasattr(owner, part):
            raise LookupError(f"{target!r}: {getattr(owner, '__name__', owner)!r} has no attribute {part!r}")
        owner = getattr(owner, part)
    if not hasattr(owner, qualname[-1]):
        raise LookupError(f"{target!r}: {getattr(owner, '__name__', owner)!r} has no attribute {qualname[-1]!r}")
    return owner, qualname[-1]


def _implementation(item: dict):
    """The function of the implementation's (copied) source that takes the target's place."""
    name = f"magpie_replacement_{item['kernel']}_{item['implementation']}".replace("-", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, item["source"])
    if spec is None or spec.loader is None:
        raise LookupError(f"cannot load {item['source']}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, item["function"], None)
    if not callable(fn):
        raise LookupError(f"{item['source_name']} defines no function {item['function']!r}")
    return fn


def _patch(module, qualname: list[str], item: dict, records: str) -> None:
    owner, attr = _owner_and_name(module, qualname, item["target"])
    fn = _implementation(item)
    first = threading.Lock()
    called = []
    described = {k: item[k] for k in ("kernel", "implementation", "target", "source_digest")}

    def replacement(*args, **kwargs):
        if not called:
            with first:
                if not called:
                    called.append(True)
                    _write_record(records, "called", described)
        return fn(*args, **kwargs)

    replacement.__name__ = attr
    replacement.__qualname__ = ".".join(qualname)
    replacement.__wrapped__ = fn  # type: ignore[attr-defined]
    setattr(owner, attr, replacement)
    _write_record(records, "installed", described)


class _ExecThenPatch(importlib.abc.Loader):
    def __init__(self, loader, after):
        self._loader, self._after = loader, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give the target's module."""

    def __init__(self, name: str, after):
        self.name, self.after = name, after

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ExecThenPatch(spec.loader, self.after)
                return spec
        return None


_installed: list[bool] = []


def install() -> None:
    """Patches each target of the plan in this process, now if its module is loaded, else once it is; once per
    process (vLLM's plugin loader calls it where `sitecustomize` already has)."""
    if _installed:
        return
    _installed.append(True)
    plan = _plan()
    records = plan["records"]
    for item in plan["replacements"]:

        def after(module, item=item, qualname=None):
            try:
                _patch(module, qualname or _split_target(item["target"])[1], item, records)
            except Exception as err:  # the runner reads the record and fails the run with this line
                _write_record(records, "failed", {"target": item["target"], "error": f"{type(err).__name__}: {err}"})

        try:
            module_name, qualname = _split_target(item["target"])
        except LookupError as err:
            _write_record(records, "failed", {"target": item["target"], "error": str(err)})
            continue
        if module_name in sys.modules:
            after(sys.modules[module_name], qualname=qualname)
        else:
            sys.meta_path.insert(0, _PatchOnImport(module_name, lambda m, a=after, q=qualname: a(m, qualname=q)))


def check() -> None:
    """Every target and implementation of the plan resolved here; the first that is not, one line on stderr,
    exit 2."""
    plan = _plan()
    for item in plan["replacements"]:
        try:
            module_name, qualname = _split_target(item["target"])
            module = importlib.import_module(module_name)
            _owner_and_name(module, qualname, item["target"])
            _implementation(item)
        except Exception as err:
            print(
                f"kernel {item['kernel']!r} replaces {item['target']!r}, which cannot be installed: "
                f"{type(err).__name__}: {err}",
                file=sys.stderr,
            )
            sys.exit(2)
