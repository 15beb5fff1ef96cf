"""The no-op fast path: a snapshot of what the last full load saw.

Computing keys needs the validated manifest (pydantic) and content hashes of every input.
When nothing those keys depend on has been touched since the last load — the same
manifest bytes, the same stat of every input file, rule file, template and magpie source
file, the same interpreter, packages folders and compilers — the keys are the ones saved
here, and "is the build up to date" is one stat per artifact file, compared with the stat
it had when its digest was last found right (nothing is hashed). Any doubt means a full load,
which computes keys from contents, so a stale snapshot can cost time but never a wrong
answer about what is up to date. Imports nothing heavy on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

VERSION = 2  # 2: artifacts' stamps
NAME = "graph-snapshot.json"
_PACKAGE = Path(__file__).resolve().parents[1]


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size]


def _tool(name: str) -> list | None:
    path = shutil.which(name)
    return [path, _stat(path)] if path else None


def environment() -> dict:
    """What fingerprints are computed from, by stat rather than by reading."""
    return {
        "python": sys.version,
        "executable": sys.executable,
        "sys_path": [[p, _stat(p)] for p in sys.path if p and os.path.isdir(p)],
        "tools": {name: _tool(name) for name in ("nvcc", "hipcc")},
        "cpu": os.cpu_count(),
    }


def _watched(project) -> list[str]:
    from magpie.paths import rules_dir, templates_dir

    paths = {str(project.manifest_path.resolve())}
    for spec in project.tasks.values():
        for name in spec.inputs:
            if name.startswith("magpie-templates/"):
                continue
            paths.add(str((project.root / name).resolve()))
    for trace in project.manifest.traces:  # a trace added to a folder changes the folder's stat
        folder = (project.root / trace.dir).resolve()
        paths.update([str(folder), *(str(d) for d in folder.rglob("*") if d.is_dir())])
    paths.update(str(p) for p in rules_dir().glob("*.toml"))
    paths.update(str(p) for p in templates_dir().glob("*.j2"))
    paths.update(str(p) for p in _PACKAGE.rglob("*.py"))
    return sorted(paths)


def path_for(manifest_path: Path, workspace: str) -> Path:
    return manifest_path.resolve().parent / workspace / NAME


def save(project, data: dict | None = None) -> dict:
    """Write the snapshot of a loaded project; returns it. Called again after the build with
    the same `data` (its stamps of inputs are the ones the keys were computed from) to add
    the artifacts' stamps: their files' stat when their digests were last found right. The
    stamps of the snapshot this one replaces are carried over (a stamp holds only while the
    stat does) and given to the store, which then needs to hash only what changed."""
    from magpie.store import atomic_write

    workspace = project.manifest.project.workspace
    store = project.store
    if data is None:
        for key, stamp in _previous_stamps(path_for(project.manifest_path, workspace), store).items():
            store.stamps.setdefault(key, stamp)
        data = {
            "version": VERSION,
            "manifest": str(project.manifest_path.resolve()),
            "workspace": str(store.workspace.resolve()),
            "environment": environment(),
            "stamps": {p: _stat(p) for p in _watched(project)},
            "tasks": {name: {"key": spec.key, "rule": spec.rule, "kernel": spec.kernel}
                      for name, spec in project.tasks.items()},
        }
    for task in data["tasks"].values():
        task["stamp"] = store.stamps.get(task["key"])
    atomic_write(path_for(project.manifest_path, workspace), json.dumps(data))
    return data


def _previous_stamps(path: Path, store) -> dict:
    try:
        data = json.loads(path.read_text())
        if data.get("version") != VERSION or data.get("workspace") != str(store.workspace.resolve()):
            return {}
        return {t["key"]: t["stamp"] for t in data["tasks"].values() if t.get("stamp")}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def load_fresh(manifest_path: Path) -> dict | None:
    """The saved snapshot if nothing it depends on changed, else None."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        workspace = tomllib.loads(manifest_path.read_text()).get("project", {}).get("workspace", "workspaces")
        data = json.loads(path_for(manifest_path, str(workspace)).read_text())
    except (OSError, ValueError, AttributeError):
        return None
    if data.get("version") != VERSION or data.get("manifest") != str(manifest_path.resolve()):
        return None
    if data["environment"] != json.loads(json.dumps(environment())):
        return None
    for path, stamp in data["stamps"].items():
        if _stat(path) != stamp:
            return None
    return data
