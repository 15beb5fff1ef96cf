"""The no-op fast path: a snapshot of what the last full load saw.

Computing keys needs the validated manifest (pydantic) and content hashes of every input.
When nothing those keys depend on has been touched since the last load — the same
manifest bytes, the same stat of every input file, rule file, template and magpie source
file, the same interpreter, packages folders and compilers — the keys are the ones saved
here, and "is the build up to date" is one stat per artifact file, compared with the stat
it had when its digest was last found right (nothing is hashed). Any doubt means a full load,
which computes keys from contents, so a stale snapshot can cost time but never a wrong
answer about what is up to date. Imports nothing heavy on purpose.

The snapshot lies in the workspace, which a CI cache restores, and its stamps let artifacts
be trusted unread: its first line is a MAC of the rest under a key derived from the store's
signing secret (`magpie.store.signing`), and a snapshot whose MAC fails is not used at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

VERSION = 3  # 2: artifacts' stamps; 3: MAC'd, the trusted signers recorded
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


def package_files() -> list[str]:
    """magpie's own code: a change to it may change what a load computes."""
    return [str(p) for p in _PACKAGE.rglob("*.py")]


def _watched(project) -> list[str]:
    from magpie.paths import rules_dir, templates_dir
    from magpie.store import signing

    root = str(project.root)
    if project.last_load is not None:  # what the load watched: the manifest, trace folders, rules, magpie
        # and the input files, as the record lists them (no task's body read for its inputs)
        names = project.last_load["readers"]
        inputs = {os.path.join(root, name) for name in names if not name.startswith("magpie-templates/")}
        return sorted(inputs | set(project.last_load["watched"]))
    inputs = {
        os.path.join(root, name)
        for spec in project.tasks.values()
        for name in spec.inputs
        if not name.startswith("magpie-templates/")
    }
    paths = {str(project.manifest_path.resolve()), *inputs}
    for trace in project.manifest.traces:  # a trace added to a folder changes the folder's stat
        folder = (project.root / trace.dir).resolve()
        paths.update([str(folder), *(str(d) for d in folder.rglob("*") if d.is_dir())])
    paths.update(str(p) for p in rules_dir().glob("*.toml"))
    paths.update(str(p) for p in templates_dir().glob("*.j2"))
    paths.update(package_files())
    paths.add(str(signing.config_dir() / signing.TRUSTED_FILE))  # trusting fewer signers re-checks artifacts
    return sorted(paths)


def path_for(manifest_path: Path, workspace: str) -> Path:
    return manifest_path.resolve().parent / workspace / NAME


def workspace_of(manifest_path: Path) -> str:
    """The manifest's `[project] workspace`, read without validating the manifest, and without parsing
    all of it where it can be found in less: TOML can give that key only before the first table header,
    or in the `[project]` table (a 10,000-artifact manifest takes 0.1-0.2 s to parse whole)."""
    import tomllib

    text = Path(manifest_path).read_text()
    # the lines up to the first table header, and the [project] table's (up to the header after it):
    # found by a search of the text, not line by line (10,000 lines and more)
    headers = [m.start() for m in _HEADER.finditer(text)]
    kept = text[: headers[0]] if headers else text
    for n, start in enumerate(headers):
        end = text.find("\n", start)
        if text[start : end if end >= 0 else len(text)].split("#", 1)[0].strip() == "[project]":
            kept += "\n" + text[start : headers[n + 1] if n + 1 < len(headers) else len(text)]
    try:
        project = tomllib.loads(kept).get("project", {})
    except tomllib.TOMLDecodeError:  # a multi-line string holding '[' at a line's start
        project = {}
    if "workspace" not in project and "workspace" in text:  # written some other way: parse it whole
        project = tomllib.loads(text).get("project", {})
    return str(project.get("workspace", "workspaces"))


_HEADER = re.compile(r"^[ \t]*\[", re.MULTILINE)  # a line starting a table (or an array's item)


def write_signed(path: Path, body: bytes) -> None:
    """`body` behind a first line of its MAC under the store's secret; not written (a cache) where the
    workspace is read-only or full."""
    from magpie.store import atomic_write, signing

    try:
        atomic_write(path, signing.snapshot_mac(body).encode() + b"\n" + body)
    except OSError as err:
        from magpie.workspace import unwritable

        if not unwritable(err):
            raise


def read_signed(path: Path) -> bytes | None:
    """What `write_signed` wrote there, when its MAC is this secret's; None otherwise."""
    from magpie.store import signing

    try:
        mac, body = path.read_bytes().split(b"\n", 1)
    except (OSError, ValueError):
        return None
    return body if signing.mac_matches(signing.snapshot_mac(body), mac.decode(errors="replace")) else None


def save(project, data: dict | None = None) -> dict:
    """Write the snapshot of a loaded project; returns it. Called again after the build with
    the same `data` (its stamps of inputs are the ones the keys were computed from) to add
    the artifacts' stamps: their files' stat when their digests were last found right. The
    stamps of the snapshot this one replaces are carried over (a stamp holds only while the
    stat does) and given to the store, which then needs to hash only what changed."""
    from magpie.graph.last_load import gc_paused

    return gc_paused(_save)(project, data)


def taken(project) -> dict:
    """The snapshot of a loaded project as its keys were computed (its inputs' stat now), not written: a
    build writes it once done (`save(project, data)`, with its artifacts' stamps), and until then the
    snapshot there is the last one, whose inputs' stat is not this load's (a build killed meanwhile
    leaves a snapshot that declines)."""
    from magpie.graph.last_load import gc_paused

    return gc_paused(_taken)(project)


def _taken(project) -> dict:
    store = project.store
    trusted = take_stamps(project)
    return {
        "version": VERSION,
        "manifest": str(project.manifest_path.resolve()),
        "workspace": str(store.workspace.resolve()),
        "trusted_signers": trusted,
        "environment": environment(),
        "stamps": {p: _stat(p) for p in _watched(project)},
        "tasks": {
            name: {"key": spec.key, "rule": spec.rule, "kernel": spec.kernel} for name, spec in project.tasks.items()
        },
    }


def _save(project, data: dict | None) -> dict:
    from magpie.graph import last_load
    from magpie.store import PROVISIONAL

    store = project.store
    if data is None:
        data = _taken(project)
    else:  # after the build: a task it re-ran under the same key gave its dependents new keys
        if project.last_load is not None:  # those of what it ran, and what depends on them
            last_load.after_build(project)
            last_load.save(project)
        else:
            project.resolve_keys()
        for name, task in data["tasks"].items():
            task["key"] = project.tasks[name].key
    for task in data["tasks"].values():
        stamp = task["stamp"] = store.stamps.get(task["key"])
        # a result not final (an inconclusive timing): the fast path declines while one is stored. It passes
        # only artifacts whose stamps hold, and a stamp lists every file of its artifact, the marker among
        # them (`Store.scan`, `Store.commit`): read there, not by an `open` per task
        task["provisional"] = any(entry[0] == PROVISIONAL for entry in stamp or ())
    # a cache: without it (read-only or full workspace) the next build loads in full
    write_signed(store.workspace / NAME, json.dumps(data).encode())
    return data


def take_stamps(project) -> list[str]:
    """The last snapshot's stamps of artifacts given to the project's store (which then needs to hash
    only what changed), where it trusted the signers trusted now; returns those."""
    store = project.store
    trusted = _trusted(store)
    if store.stamps:  # given by the last load (graph/last_load.py), under these signers
        return trusted
    for key, stamp in _previous_stamps(store.workspace / NAME, store, trusted).items():
        store.stamps.setdefault(key, stamp)
    return trusted


def _trusted(store) -> list[str]:
    from magpie.store import signing

    return sorted(store.configured_signers | signing.user_trusted_signers())


def _read(path: Path) -> dict | None:
    """The snapshot at path when its MAC is this secret's; None otherwise."""
    body = read_signed(path)
    return json.loads(body) if body is not None else None


def _previous_stamps(path: Path, store, trusted: list[str]) -> dict:
    try:
        data = _read(path)
        if (
            data is None
            or data.get("version") != VERSION
            or data.get("workspace") != str(store.workspace.resolve())
            or data.get("trusted_signers") != trusted
        ):
            return {}
        return {t["key"]: t["stamp"] for t in data["tasks"].values() if t.get("stamp")}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def load_fresh(manifest_path: Path) -> dict | None:
    """The saved snapshot if nothing it depends on changed, else None."""
    try:
        data = _read(path_for(manifest_path, workspace_of(manifest_path)))
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("version") != VERSION or data.get("manifest") != str(manifest_path.resolve()):
        return None
    if data["environment"] != json.loads(json.dumps(environment())):
        return None
    for path, stamp in data["stamps"].items():
        if _stat(path) != stamp:
            return None
    return data
