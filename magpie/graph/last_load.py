"""The last load of a project, kept for the next: after an edit, only what it changed is worked out again.

A full load validates the manifest, expands every task and hashes every input; at 10,000 artifacts that
is seconds, where one edited file changes the keys of a handful of tasks. So every load of a project
(`Project.load`) leaves its tasks here (`graph-last-load.bin` in the workspace): their declarations, keys
and key parts, each input file's digest with the stat it had when hashed, and the stat of each task's
artifact folder when its dependents' keys were worked out from it. The next load:

- where nothing but input files changed (the manifest, rules, templates, magpie's own code, the
  interpreter and packages, the trusted signers, the watched folders all have their recorded stat):
  takes the tasks from here without reading the manifest (`Project.manifest` is read when first
  asked for), hashes again only the inputs whose stat moved, and resolves again only the keys of the
  tasks that read a changed file and of what depends on them;
- otherwise (a manifest edit): loads in full, but an input whose stat is the recorded one is not read
  again, and a task whose own part of the key is the recorded one, and whose dependencies' keys and
  artifacts are too, keeps its recorded key (`expand.resolve_changed`): only what the edit reaches is
  re-keyed.

In both, a task whose artifact folder is not the one recorded (built, rebuilt, removed since, by this
build or another) has its dependents' keys resolved again from the store. Any doubt (a file gone, a path
now resolving outside the project, a record that does not parse) means a full load: a stale record can
cost time, never a wrong key; the property test (tests/test_incremental_keys.py) holds incremental keys
to a full recomputation's.

The record lies in the workspace, which a CI cache restores: its first line is a MAC of the rest under the
store's secret (`signing.snapshot_mac`), and it is read (by `marshal`, which builds plain data and runs
nothing) only once that MAC holds. Imports nothing heavy.

Work in proportion to the edit, not to the project (a 10,000-task project's record is 9 MB):
- a task's row is split: what every load reads of every task (its name, rule, kernel, dependencies, key:
  `_HEAD`) apart from what only the tasks an edit reaches are asked for (their inputs, settings, key
  parts: `_BODY`), kept marshalled per task (`RecordedTask`), unmarshalled when first read;
- an edit is found by one stat per input file (not per task), each file's readers listed in the record;
- an artifact committed or removed since (by this build or another) is found by the stat of its store
  shard (`objects/ab/`, 256 of them), whose entries a commit or removal adds or takes: only the folders
  of the shards that moved are stat'ed (`_shards`);
- keys are resolved again only in the cone of what changed (`resolve_cone`: its dependents, in run order).
The cyclic garbage collector, which would walk the record's containers again each time their number
grows by a quarter, is paused while one is read, worked through or written (`gc_paused`); nothing made
here forms a cycle, so nothing is left for it to find.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import marshal
import operator
import os
import sys
import time
from pathlib import Path

from magpie.graph.expand import TaskSpec

VERSION = 5  # 2: stamps; 3: kept inputs' folder; 4: trust_code, cache_declared; 5: bodies, readers, shards
NAME = "graph-last-load.bin"
_HEAD = ("name", "rule", "scope", "action", "kernel", "impl", "deps", "after", "key")  # read of every task
_BODY = ("inputs", "config", "fingerprint", "params", "parts")  # read of the tasks an edit reaches


CHUNK = 64  # tasks whose bodies are marshalled together: their shared settings kept once (marshal's refs)


class _Chunk:
    """The bodies of `CHUNK` consecutive tasks of a record, marshalled together; unmarshalled once, when a
    body of one of them is first read."""

    __slots__ = ("blob", "rows")

    def __init__(self, blob: bytes):
        self.blob = blob
        self.rows: list | None = None


class RecordedTask(TaskSpec):
    """A task as the last load left it: its `_BODY` fields unmarshalled from its chunk (`_body`: the chunk
    and the task's place in it) when first read (a load after one edit reads those of the few tasks the
    edit reaches, of 10,000)."""

    def __getattr__(self, field: str):  # only for fields not set: the body's, until it is read
        body = self.__dict__.pop("_body", None)
        if body is None:
            raise AttributeError(field)
        chunk, at = body
        if chunk.rows is None:
            chunk.rows = marshal.loads(chunk.blob)
        self.__dict__.update(zip(_BODY, chunk.rows[at]))
        return getattr(self, field)

    def __reduce__(self):  # sent to a job as the plain TaskSpec it stands for, not with its chunk
        return TaskSpec, tuple(getattr(self, field.name) for field in dataclasses.fields(TaskSpec))


def _chunks(specs: list[TaskSpec]) -> list[bytes]:
    """The tasks' bodies, `CHUNK` by `CHUNK`: a chunk of recorded tasks none of whose bodies was read (so
    none changed) as it was recorded, others marshalled as they are now."""
    blobs = []
    for start in range(0, len(specs), CHUNK):
        group = specs[start : start + CHUNK]
        first = group[0].__dict__.get("_body")
        chunk = first[0] if first is not None else None
        if chunk is not None and all(spec.__dict__.get("_body") == (chunk, n) for n, spec in enumerate(group)):
            blobs.append(chunk.blob)  # never read, so its rows are the recorded ones: the same count
        else:
            blobs.append(marshal.dumps([_body_fields(spec) for spec in group]))
    return blobs


_body_fields = operator.attrgetter(*_BODY)
_head_fields = operator.attrgetter(*_HEAD)


def gc_paused(function):
    """`function` run with the cyclic garbage collector paused (as it was found after)."""

    @functools.wraps(function)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()

    return paused


def path_for(workspace: Path) -> Path:
    return Path(workspace) / NAME


def folder_identity(store, key: str) -> list[int] | None:
    """The stat of the key's artifact folder: a commit under the key (a rebuild) makes another folder.
    A task with none (not built, or removed) counts as moved at every load: what depends on it is keyed
    by what it finds of it (a gate by its last recorded verdict), which no recorded stat vouches for."""
    try:
        st = os.stat(f"{store.objects}/{key[:2]}/{key}")
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def _folder_stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def watched(manifest, root: Path, manifest_path: Path) -> dict:
    """{path: stat} of what a load depends on beside its input files' contents: the manifest; the rules,
    templates and magpie's own code (their folders too: a file added); the trusted signers' file; every
    folder an input was found in by listing (trace sets, model folders)."""
    from magpie.graph.snapshot import package_files
    from magpie.paths import rules_dir, templates_dir
    from magpie.store import signing

    paths = {str(Path(manifest_path).resolve()), str(rules_dir()), str(templates_dir())}
    paths.update(str(p) for p in rules_dir().glob("*.toml"))
    paths.update(str(p) for p in templates_dir().glob("*.j2"))
    paths.update(package_files())
    paths.add(str(signing.config_dir() / signing.TRUSTED_FILE))
    for trace in manifest.traces:
        folder = root / trace.dir
        paths.update([str(folder), *(str(d) for d in folder.rglob("*") if d.is_dir())])
    for bench in manifest.benchmark:
        from magpie.serving.report import local_model_path

        model = local_model_path(str(root / bench.model)) or local_model_path(bench.model)
        if model is not None and model.is_dir():
            paths.update([str(model), *(str(d) for d in model.rglob("*") if d.is_dir())])
    return {path: _folder_stat(path) for path in sorted(paths)}


def kept_inputs_folder(store) -> list[int] | None:
    """Which folder the inputs' bytes are kept in (`expand.FileHasher`): one removed (and made again)
    since means a full load, which keeps again what its tasks were keyed by. Not its mtime, which a
    new input's bytes move."""
    try:
        st = os.stat(store.snapshots)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def named_paths(manifest, root: Path) -> dict[str, str]:
    """{path: where it really is} for the paths the manifest names that are no task's input (working
    folders, KernelBench problems, kernel source repositories): the load checked them inside the
    project; one that resolves elsewhere now means a full load, which checks it again."""
    names: set[str] = set()
    for kernel in manifest.kernel:
        for impl in kernel.implementations():
            if impl.working_dir:
                names.add(impl.working_dir)
        if kernel.kernelbench:
            names.add(kernel.kernelbench)
        names.update(t.working_dir for t in kernel.testcases if t.working_dir)
    for trace in manifest.traces:
        names.update(trace.kernel_source_repos)
    return {str(root / name): os.path.realpath(root / name) for name in sorted(names)}


def record_of(project, hasher, previous: dict | None = None) -> dict:
    """What a full load leaves for the next, beside its tasks: `previous`'s folders are kept for the
    tasks `resolve_changed` left alone (their dependents' keys were worked out from them)."""
    from magpie.graph.snapshot import environment
    from magpie.store import signing

    store = project.store
    return {
        "version": VERSION,
        "python": sys.version,
        "manifest": str(Path(project.manifest_path).resolve()),
        "root": str(project.root),
        "workspace": str(store.workspace.resolve()),
        "workspace_name": str(project.manifest.project.workspace),
        "trust_code": bool(project.manifest.project.trust_code),
        "cache_declared": project.manifest.store.cache is not None,
        "configured_signers": sorted(store.configured_signers),
        "trusted_signers": sorted(store.configured_signers | signing.user_trusted_signers()),
        "environment": environment(),
        "watched": watched(project.manifest, project.root, project.manifest_path),
        "kept_inputs": kept_inputs_folder(store),
        "named": named_paths(project.manifest, project.root),
        "remembered": hasher.remembered,
        "folders": {},
    }


@gc_paused
def read(manifest_path: Path) -> dict | None:
    """The last load of the manifest's project, when its MAC holds and it is of this magpie and interpreter."""
    from magpie.graph.snapshot import read_signed, workspace_of

    manifest_path = Path(manifest_path)
    try:
        body = read_signed(manifest_path.resolve().parent / workspace_of(manifest_path) / NAME)
        data = marshal.loads(body) if body is not None else None
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("version") != VERSION
        or data.get("python") != sys.version
        or data.get("manifest") != str(manifest_path.resolve())
    ):
        return None
    return data


def previous_tasks(record: dict | None) -> dict[str, tuple[str, dict]]:
    """{task: (key, parts)} of the last load (every body read: a full load compares every task)."""
    if record is None:
        return {}
    key_at, parts_at = _HEAD.index("key"), _BODY.index("parts")
    try:
        heads, chunks = record["tasks"]
        bodies = [body for blob in chunks for body in marshal.loads(blob)]
        return {head[0]: (head[key_at], body[parts_at]) for head, body in zip(heads, bodies, strict=True)}
    except (KeyError, TypeError, ValueError, IndexError, EOFError):  # not of this layout: keys worked out anew
        return {}


def _shards(store) -> dict[str, list | None]:
    """{shard: its stat} of the store's shard folders (`objects/ab`): a commit or removal of an artifact
    adds or takes an entry of its shard, which moves the shard's mtime and ctime. A shard changed less
    than `SETTLED_S` before is recorded as None (its folders stat'ed at the next load): a change within
    the same tick of the file system's clock can leave those times as they were (git's racily clean
    files). Taken before the folders are: a change after it is a change to the next load."""
    from magpie.store.digests import SETTLED_S

    settled = time.time_ns() - SETTLED_S * 1e9
    try:
        names = os.listdir(store.objects)
    except OSError:
        return {}
    found = {}
    for name in names:
        try:
            st = os.stat(f"{store.objects}/{name}")
        except OSError:
            continue
        settled_stat = max(st.st_mtime_ns, st.st_ctime_ns) < settled
        found[name] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] if settled_stat else None
    return found


def _moved_shards(store, recorded: dict[str, list | None]) -> tuple[dict[str, list | None], set[str]]:
    """The shards now, and those not as recorded (recorded unsettled, new, or gone): their folders may
    have moved."""
    now = _shards(store)
    moved = {shard for shard, stat in now.items() if stat is None or recorded.get(shard) != stat}
    return now, moved | (recorded.keys() - now.keys())


def dependents_of(tasks: dict[str, TaskSpec]) -> dict[str, list[str]]:
    """{task: the tasks that depend on it}, from every task's dependencies (none of their bodies read)."""
    found: dict[str, list[str]] = {}
    for name, spec in tasks.items():
        for dep in spec.deps:
            found.setdefault(dep, []).append(name)
    return found


def resolve_cone(
    tasks: dict[str, TaskSpec], dirty: set[str], moved: set[str], result_digest, rekeyed=lambda name: None
) -> set[str]:
    """`expand.resolve_changed` for tasks that hold their last keys and parts already (a load from the last
    one, or a build's tasks after it ran some): resolved again only the tasks `dirty` (their own part of
    the key changed), those depending on one `moved` (its artifact committed again or removed) and, where
    one's key changed, what depends on it: in run order, visiting nothing outside that cone. Returns the
    tasks re-keyed or moved."""
    import heapq

    from magpie.graph.expand import resolve_key

    dependents = dependents_of(tasks)
    names = list(tasks)
    order = {name: n for n, name in enumerate(names)}
    changed = set(moved)
    heap = [order[name] for name in dirty | {d for name in moved for d in dependents.get(name, ())}]
    heapq.heapify(heap)
    seen: set[int] = set()
    while heap:
        at = heapq.heappop(heap)
        if at in seen:
            continue
        seen.add(at)
        name = names[at]
        spec = tasks[name]
        before, recorded = spec.key, spec.parts.get("deps", {})

        def digest(dep: str, key: str, recorded: dict = recorded) -> str | None:
            then = recorded.get(dep)
            if dep not in changed and then is not None and then[0] == key:
                return then[1]
            return result_digest(dep, key)

        if resolve_key(spec, tasks, digest) != before:
            changed.add(name)
            rekeyed(name)
            for dependent in dependents.get(name, ()):
                heapq.heappush(heap, order[dependent])
    return changed


@gc_paused
def reuse(record: dict, manifest_path: Path, project_class):
    """The project (a `project_class`, given from above: the graph lies below the project) from the last
    load where only input files changed since (None otherwise): the inputs whose stat moved hashed again,
    the keys they reach resolved again; the other tasks' bodies left unread."""
    from magpie.graph.expand import FileHasher, stat_identity
    from magpie.graph.snapshot import environment
    from magpie.store import Store
    from magpie.workspace import writable

    try:
        if record["environment"] != environment() or record["trusted_signers"] != _trusted(record):
            return None
        if any(_folder_stat(path) != stat for path, stat in record["watched"].items()):
            return None
        if any(os.path.realpath(path) != real for path, real in record["named"].items()):
            return None
        root = Path(record["root"])
        store = Store(Path(record["workspace"]), trusted_signers=tuple(record["configured_signers"]))
        if not writable(store.workspace) or kept_inputs_folder(store) != record["kept_inputs"]:
            return None
        store.stamps.update(record["stamps"])  # kept under the same trusted signers (checked above)
        remembered = record["remembered"]
        hasher = FileHasher(store.snapshots, store.file_digests, remembered)
        real_root, root_name = os.path.realpath(root), str(root)
        readers = {name: list(entry) for name, entry in record["readers"].items()}
        dirty: set[str] = set()
        edited: set[str] = set()
        for input_name, entry in readers.items():  # one stat per input file, however many tasks read it
            path = _input_file(root_name, input_name)
            known = remembered.get(path)
            if known is not None and stat_identity(path) == known[0]:
                digest = known[1]
            elif stat_identity(path) is None or not _inside(real_root, input_name, path):
                return None  # gone, or now elsewhere: the full load says so in its own words
            else:
                digest = hasher(Path(path))
            if digest != entry[0]:
                entry[0] = digest
                edited.add(input_name)
                dirty.update(entry[1])
        heads, blobs = record["tasks"]
        if len(blobs) != -(-len(heads) // CHUNK):
            return None
        chunks = [_Chunk(blob) for blob in blobs]
        tasks: dict[str, TaskSpec] = {}
        new_task = RecordedTask.__new__
        for n, head in enumerate(heads):
            # as RecordedTask(**dict(zip(_HEAD, head))) makes it, in a third of the time (10,000 per load)
            recorded = new_task(RecordedTask)
            fields = recorded.__dict__
            fields.update(zip(_HEAD, head))
            fields["_body"] = (chunks[n // CHUNK], n % CHUNK)
            tasks[head[0]] = recorded
        for name in dirty:
            spec = tasks[name]
            spec.parts = {**spec.parts, "inputs": {n: readers[n][0] for n in spec.parts["inputs"]}}
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    project = project_class(None, root, Path(manifest_path), tasks, store)
    folders = dict(record["folders"])
    shards, moved_shards = _moved_shards(store, record["shards"])
    moved = set()
    for name, spec in tasks.items():
        then = folders.get(name)
        if then is None or spec.key[:2] in moved_shards:
            now = folder_identity(store, spec.key)
            if now is None or now != then:
                moved.add(name)
                folders[name] = now
    changed = resolve_cone(
        tasks,
        dirty,
        moved,
        project.result_digest,
        lambda name: folders.update({name: folder_identity(store, tasks[name].key)}),
    )
    project.last_load = {
        **record,
        "remembered": {**remembered, **hasher.remembered},
        "readers": readers,
        "folders": folders,
        "shards": shards,
        "tasks": None,
    }
    # saved at load only where much was worked out again (a branch checked out): a few edits' cone
    # costs less to work out again than the record to write; a build saves it after it anyway
    project.last_load_changed = len(changed) > len(tasks) // 20
    return project


@gc_paused
def resolve_from(project, hasher, record: dict | None) -> None:
    """A fully loaded project's keys: those of the last load (`record`) kept where a task's own part of
    the key, its dependencies' keys and their artifacts are the recorded ones; the rest resolved."""
    from magpie.graph.expand import resolve_changed

    store = project.store
    last = previous_tasks(record)
    recorded_folders = record["folders"] if record is not None else {}
    if record is not None and record["trusted_signers"] == _trusted(record):
        store.stamps.update(record["stamps"])
    shards = _shards(store)
    folders: dict[str, list | None] = {}
    dirty, moved = set(), set()
    for name, spec in project.tasks.items():
        before = last.get(name)
        if before is None:
            continue
        if spec.parts != {part: value for part, value in before[1].items() if part != "deps"}:
            dirty.add(name)
        folders[name] = folder_identity(store, before[0])
        if folders[name] is None or folders[name] != recorded_folders.get(name):
            moved.add(name)
    resolve_changed(
        project.tasks,
        last,
        dirty,
        moved,
        project.result_digest,
        lambda name: folders.update({name: folder_identity(store, project.tasks[name].key)}),
    )
    readers: dict[str, list] = {}
    for name, spec in project.tasks.items():
        for input_name, digest in spec.parts["inputs"].items():
            readers.setdefault(input_name, [digest, []])[1].append(name)
    project.last_load = {
        **record_of(project, hasher),
        "readers": readers,
        "folders": folders,
        "shards": shards,
    }
    project.last_load_changed = True


def _input_file(root: str, name: str) -> str:
    """`expand.input_path` as a string, without pathlib (thousands of inputs per load)."""
    if name.startswith("magpie-templates/"):
        from magpie.paths import templates_dir

        return str(templates_dir() / name.split("/", 1)[1])
    return os.path.join(root, name)


def _trusted(record: dict) -> list[str]:
    from magpie.store import signing

    return sorted(set(record["configured_signers"]) | signing.user_trusted_signers())


def _inside(real_root: str, name: str, path: str) -> bool:
    """A changed input still inside the project (the manifest's check, for this one path); inputs named
    by absolute path (a model folder elsewhere) and magpie's templates are outside by design."""
    if name.startswith("magpie-templates/") or os.path.isabs(name):
        return True
    return os.path.realpath(path).startswith(real_root + os.sep)


@gc_paused
def save(project) -> None:
    """Leave the project's load (`project.last_load`, its tasks as they are now) for the next."""
    from magpie.graph.snapshot import write_signed

    record = project.last_load
    if record is None:
        return
    specs = list(project.tasks.values())
    tasks = [[_head_fields(spec) for spec in specs], _chunks(specs)]
    # the artifacts' stamps (graph/snapshot.py): a load from here trusts them without reading the snapshot
    stamps, known = {}, project.store.stamps
    for spec in specs:
        if spec.key in known:
            stamps[spec.key] = known[spec.key]
    write_signed(path_for(project.store.workspace), marshal.dumps({**record, "tasks": tasks, "stamps": stamps}))


@gc_paused
def after_build(project) -> None:
    """The keys a build changed: what depends on a task it ran (its new artifact) resolved again, and
    their artifact folders recorded as their dependents' keys now read them."""
    record = project.last_load
    store = project.store
    folders = record["folders"]
    ran = set(project.rebuilt)
    for name in ran:
        folders[name] = folder_identity(store, project.tasks[name].key)
    resolve_cone(
        project.tasks,
        set(),
        ran,
        project.result_digest,
        lambda name: folders.update({name: folder_identity(store, project.tasks[name].key)}),
    )


def trust_code(project) -> bool:
    """The manifest's `[project] trust_code`: from the last load where the manifest was not read (its stat
    is the one recorded, so the value is the one the record was made from)."""
    if project.loaded_manifest is None and project.last_load is not None:
        return bool(project.last_load["trust_code"])
    return bool(project.manifest.project.trust_code)


def cache_declared(project) -> bool:
    """Whether the manifest's `[store] cache` names a shared cache, as `trust_code` reads it."""
    if project.loaded_manifest is None and project.last_load is not None:
        return bool(project.last_load["cache_declared"])
    return project.manifest.store.cache is not None
