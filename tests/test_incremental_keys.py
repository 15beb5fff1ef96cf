"""Incremental loads (graph/last_load.py) give the keys a full recomputation gives.

Random projects take random edits (a source edited or only touched, the manifest's settings or
implementations changed, one task's artifact committed as a build would, or removed); after each, the
project loaded from the last load has every task's key and key parts equal to those of a load from the
manifest alone. No task runs: artifacts are committed to the real store directly.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magpie.graph import expand as expand_module
from magpie.graph import last_load
from magpie.manifest.load import load_manifest
from magpie.project import Project
from magpie.store import digests


@pytest.fixture(autouse=True)
def settled_at_once(monkeypatch):
    """Files hashed are remembered by stat at once (not only 2 s after their last write): the reuse of
    remembered digests is what is tested. Every edit here changes the file's size, so no edit can hide
    under an unchanged stat."""
    monkeypatch.setattr(expand_module, "SETTLED_S", 0.0)


def manifest_text(kernels: list[dict], name: str) -> str:
    lines = [f'[project]\nname = "{name}"\n']
    for k, kernel in enumerate(kernels):
        lines.append(f'[[kernel]]\nid = "k{k}"\ntype = "pytorch"\nentry = "f"\ntimeout_s = {kernel["timeout"]}\n')
        for i in range(kernel["impls"]):
            table = "[kernel.baseline]" if i == 0 else "[[kernel.candidates]]"
            lines.append(f'{table}\nid = "v{i}"\nsource = "k{k}/v{i}.py"\n')
        lines.append('[[kernel.testcases]]\ncommand = "true"\n')
    return "\n".join(lines)


def write_project(root: Path, kernels: list[dict], name: str = "p") -> None:
    for k, kernel in enumerate(kernels):
        (root / f"k{k}").mkdir(exist_ok=True)
        for i in range(kernel["impls"]):
            source = root / f"k{k}/v{i}.py"
            if not source.exists():
                source.write_text(f"def f(x):\n    return x + {i}\n")
    (root / "magpie.toml").write_text(manifest_text(kernels, name))


def full_load(manifest: Path) -> Project:
    manifest_data, root = load_manifest(manifest)
    return Project.from_manifest(manifest_data, root, manifest)


def keys(project: Project) -> dict:
    return {name: (spec.key, spec.parts) for name, spec in project.tasks.items()}


def build_one(manifest: Path, pick: int) -> None:
    """What a build does for one task whose dependencies are built: its artifact committed under its
    key and recorded, its dependents re-keyed and the load left for the next (snapshot.save's part)."""
    project = Project.load(manifest)
    names = list(project.tasks)
    for offset in range(len(names)):
        name = names[(pick + offset) % len(names)]
        spec = project.tasks[name]
        key = project.resolve(name)
        if key.startswith("unknown-"):
            continue
        if project.store.has(key):
            project.store.remove(key)  # run again under the same key (forced): another result
        project.store.commit(key, {"value": pick}, {}, task=name)
        project.store.record(name, key, spec.parts)
        project.rebuilt.add(name)
        last_load.after_build(project)
        last_load.save(project)
        return


def build_all(manifest: Path) -> None:
    """Every task's artifact committed, in run order, as a full build leaves them."""
    project = Project.load(manifest)
    for name, spec in project.tasks.items():
        key = project.resolve(name)
        if project.store.has(key):
            continue
        project.store.commit(key, {"value": name}, {}, task=name)
        project.store.record(name, key, spec.parts)
        project.rebuilt.add(name)
    last_load.after_build(project)
    last_load.save(project)


def remove_one(manifest: Path, pick: int) -> None:
    project = Project.load(manifest)
    built = [spec.key for spec in project.tasks.values() if project.store.has(spec.key)]
    if built:
        project.store.remove(built[pick % len(built)])


EDITS = st.one_of(
    st.tuples(st.just("edit"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("touch"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("timeout"), st.integers(0, 2), st.integers(1, 9)),
    st.tuples(st.just("impls"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("rename"), st.just(0), st.integers(0, 3)),
    st.tuples(st.just("build"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("build all"), st.just(0), st.just(0)),
    st.tuples(st.just("remove"), st.integers(0, 40), st.just(0)),
)


@settings(max_examples=40)
@given(
    kernels=st.lists(
        st.fixed_dictionaries({"impls": st.integers(1, 3), "timeout": st.integers(1, 9)}), min_size=1, max_size=3
    ),
    edits=st.lists(EDITS, min_size=1, max_size=8),
)
def test_incremental_keys_equal_a_full_recomputation(kernels, edits):
    follow_random_edits(kernels, edits)


@settings(max_examples=15)
@given(
    kernels=st.lists(
        st.fixed_dictionaries({"impls": st.integers(1, 3), "timeout": st.integers(1, 9)}), min_size=1, max_size=3
    ),
    edits=st.lists(EDITS, min_size=1, max_size=8),
)
def test_incremental_keys_equal_a_full_recomputation_where_store_shards_settle(kernels, edits):
    """As above, with the store's shard folders taken as settled 50 ms after they last changed (2 s
    otherwise, longer than these steps take): a load stats only the artifact folders of the shards
    whose stat moved since the last load (last_load._shards), and still gives a full load's keys."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(digests, "SETTLED_S", 0.05)
        follow_random_edits(kernels, edits, pause_after_store_change=0.06)


def follow_random_edits(kernels: list[dict], edits: list[tuple], pause_after_store_change: float = 0.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest = root / "magpie.toml"
        name = "p"
        write_project(root, kernels, name)
        Project.load(manifest)  # the first, full load, left for the next
        for step, (kind, a, b) in enumerate(edits):
            kernel = kernels[a % len(kernels)]
            if kind in ("edit", "touch"):
                source = root / f"k{a % len(kernels)}/v{b % kernel['impls']}.py"
                if kind == "edit":
                    source.write_text(source.read_text() + f"# edit {step}\n")
                else:
                    os.utime(source, ns=(0, 10**9 * step + 1))
            elif kind == "timeout":
                kernel["timeout"] = b
                write_project(root, kernels, name)
            elif kind == "impls":
                kernel["impls"] = b
                write_project(root, kernels, name)
            elif kind == "rename":
                name = f"p{b}"
                write_project(root, kernels, name)
            elif kind == "build":
                build_one(manifest, a)
            elif kind == "build all":
                build_all(manifest)
            else:
                remove_one(manifest, a)
            if kind in ("build", "build all", "remove"):
                time.sleep(pause_after_store_change)
            assert keys(Project.load(manifest)) == keys(full_load(manifest)), (kind, a, b)


@pytest.fixture(scope="module")
def twelve_kernels(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("twelve")
    write_project(root, [{"impls": 3, "timeout": 5} for _ in range(12)])
    build_all(root / "magpie.toml")
    return root


def test_a_source_edit_re_keys_only_what_depends_on_it(twelve_kernels, monkeypatch):
    """In a built project, after one candidate's source is edited, the load takes the tasks from the
    last load (the manifest is not read) and resolves only the keys of that candidate's tasks, its
    kernel's comparison and the report; every key is the one a full load computes."""
    root = twelve_kernels
    manifest = root / "magpie.toml"
    build_all(manifest)
    source = root / "k7/v2.py"
    source.write_text(source.read_text() + "# edited\n")
    resolved: list[str] = []
    resolve_key = expand_module.resolve_key

    def counted(spec, tasks, result_digest):
        resolved.append(spec.name)
        return resolve_key(spec, tasks, result_digest)

    monkeypatch.setattr(expand_module, "resolve_key", counted)
    project = Project.load(manifest)
    assert project.loaded_manifest is None
    assert sorted(resolved) == sorted(["compile:k7/v2", "correctness:k7/v2", "timing:k7/v2", "comparison:k7", "report"])
    monkeypatch.setattr(expand_module, "resolve_key", resolve_key)
    assert keys(project) == keys(full_load(manifest))
    assert project.manifest.kernel[7].id == "k7"  # read when asked for


def test_a_load_after_one_edit_reads_the_bodies_of_the_tasks_it_re_keys_alone(twelve_kernels):
    """Every task's name, rule, dependencies and key are read from the last load; its inputs, settings
    and key parts (its body) only where the edit reaches it: 5 of the 121 tasks here."""
    manifest = twelve_kernels / "magpie.toml"
    build_all(manifest)
    source = twelve_kernels / "k9/v1.py"
    source.write_text(source.read_text() + "# edited for the bodies\n")
    project = Project.load(manifest)
    read = [name for name, spec in project.tasks.items() if "_body" not in vars(spec)]
    assert read == ["compile:k9/v1", "correctness:k9/v1", "timing:k9/v1", "comparison:k9", "report"]
    full = full_load(manifest)
    assert keys(project) == keys(full)
    # a task sent to a job process goes as the plain TaskSpec it stands for, its chunk left behind
    sent = pickle.dumps(project.tasks["timing:k0/v0"])
    alone = pickle.dumps(full.tasks["timing:k0/v0"])
    assert pickle.loads(sent) == full.tasks["timing:k0/v0"] and len(sent) < 1.5 * len(alone)


@pytest.fixture
def settled_store(tmp_path, monkeypatch) -> Path:
    """A built project of six kernels whose last load was left once its store's shards had settled
    (taken as settled 50 ms after their last change here, 2 s otherwise)."""
    monkeypatch.setattr(digests, "SETTLED_S", 0.05)
    write_project(tmp_path, [{"impls": 3, "timeout": 5} for _ in range(6)])
    manifest = tmp_path / "magpie.toml"
    build_all(manifest)
    time.sleep(0.1)
    last_load.save(Project.load(manifest))  # as a build that ran nothing leaves it
    return manifest


def folder_stats(monkeypatch) -> list[str]:
    """The artifact keys whose folders a load stats from here on."""
    asked: list[str] = []
    identity = last_load.folder_identity

    def counted(store, key):
        asked.append(key)
        return identity(store, key)

    monkeypatch.setattr(last_load, "folder_identity", counted)
    return asked


def test_a_load_after_one_edit_stats_no_artifact_folder_of_a_shard_that_did_not_move(settled_store, monkeypatch):
    """An artifact committed or removed since the last load is found by its store shard's stat (a commit
    or removal adds or takes an entry there): with no shard moved, the only folders stat'ed are those of
    the tasks the edit re-keys (their new keys', recorded for the next load), not one per task."""
    source = settled_store.parent / "k3/v2.py"
    source.write_text(source.read_text() + "# edited for the shards\n")
    asked = folder_stats(monkeypatch)
    project = Project.load(settled_store)
    cone = ["compile:k3/v2", "correctness:k3/v2", "timing:k3/v2", "comparison:k3", "report"]
    assert sorted(asked) == sorted(project.tasks[name].key for name in cone)
    assert keys(project) == keys(full_load(settled_store))


def test_an_artifact_removed_by_hand_is_found_by_its_shard(settled_store):
    """An artifact folder removed outside magpie after the last load: its shard's stat moved, so the
    folders of that shard are stat'ed, and what read the removed artifact is keyed as a full load keys it."""
    project = Project.load(settled_store)
    removed = project.tasks["correctness:k4/v1"].key
    before = project.tasks["comparison:k4"].key
    shutil.rmtree(project.store.path(removed))
    project = Project.load(settled_store)
    assert project.tasks["comparison:k4"].key != before  # it read the removed artifact's digest
    assert keys(project) == keys(full_load(settled_store))


def test_a_manifest_edit_re_keys_only_what_the_edited_table_reaches(twelve_kernels, monkeypatch):
    root = twelve_kernels
    manifest = root / "magpie.toml"
    kernels = [{"impls": 3, "timeout": 5} for _ in range(12)]
    build_all(manifest)  # up to date (after the other test's edit)
    kernels[3]["timeout"] = 7
    write_project(root, kernels)
    resolved: list[str] = []
    resolve_key = expand_module.resolve_key

    def counted(spec, tasks, result_digest):
        resolved.append(spec.name)
        return resolve_key(spec, tasks, result_digest)

    monkeypatch.setattr(expand_module, "resolve_key", counted)
    project = Project.load(manifest)
    monkeypatch.setattr(expand_module, "resolve_key", resolve_key)
    # the kernel's correctness and timing tasks (their settings hold the timeout) and what they reach
    reached = [f"{rule}:k3/v{i}" for rule in ("correctness", "timing") for i in range(3)] + ["comparison:k3", "report"]
    assert sorted(resolved) == sorted(reached)
    assert keys(project) == keys(full_load(manifest))


def test_a_source_now_outside_the_project_is_refused_as_a_full_load_refuses_it(tmp_path):
    """A source replaced by a symlink out of the project after the last load: the load is the full one,
    whose check says which field names it."""
    write_project(tmp_path, [{"impls": 2, "timeout": 5}])
    manifest = tmp_path / "magpie.toml"
    Project.load(manifest)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("def f(x):\n    return x\n")
    source = tmp_path / "k0/v1.py"
    source.unlink()
    source.symlink_to(outside)
    from magpie.errors import UserError

    with pytest.raises(UserError, match="v1"):
        Project.load(manifest)


def test_a_forged_last_load_is_not_used(tmp_path):
    """The record lies in the workspace (a CI cache restores it): one rewritten without the store's
    secret (a task's key forged under the old MAC line) is not read; the load is the full one."""
    import marshal

    write_project(tmp_path, [{"impls": 2, "timeout": 5}])
    manifest = tmp_path / "magpie.toml"
    Project.load(manifest)
    record = last_load.path_for(tmp_path / "workspaces")
    mac, body = record.read_bytes().split(b"\n", 1)
    data = marshal.loads(body)
    heads = data["tasks"][0]
    heads[0] = (*heads[0][:-1], "0" * 64)  # the first task's key
    record.write_bytes(mac + b"\n" + marshal.dumps(data))
    project = Project.load(manifest)
    assert project.loaded_manifest is not None  # loaded in full
    assert keys(project) == keys(full_load(manifest))
    assert "0" * 64 not in {spec.key for spec in project.tasks.values()}


def test_a_load_from_the_last_one_gives_the_settings_a_build_reads_without_reading_the_manifest(tmp_path):
    """A build after a source edit admits code under test by `[project] trust_code`, and asks a shared cache
    only where `[store] cache` names one, as the last full load read them (the manifest's stat unchanged
    since), without validating the manifest again."""
    for declared in (True, False):
        root = tmp_path / f"declared-{declared}"
        root.mkdir()
        write_project(root, [{"impls": 2, "timeout": 5}])
        manifest = root / "magpie.toml"
        settings = f"trust_code = {str(declared).lower()}\n"
        store = '[store]\ncache = "shared"\n' if declared else ""
        manifest.write_text(manifest.read_text().replace("[project]\n", f"{store}[project]\n{settings}", 1))
        Project.load(manifest)  # the full load, left for the next
        source = root / "k0/v1.py"
        source.write_text(source.read_text() + "# edited\n")
        project = Project.load(manifest)
        assert project.loaded_manifest is None
        assert last_load.trust_code(project) is declared
        assert last_load.cache_declared(project) is declared
        assert project.loaded_manifest is None  # still unread


def store_lookups(monkeypatch) -> list[str]:
    """The keys Store.has and Store.provisional are asked about from here on."""
    from magpie.store import Store

    asked: list[str] = []
    for method in ("has", "provisional"):
        original = getattr(Store, method)

        def counted(self, key, original=original):
            asked.append(key)
            return original(self, key)

        monkeypatch.setattr(Store, method, counted)
    return asked


def test_a_dry_run_after_one_edit_asks_the_store_only_about_what_the_edit_reaches(twelve_kernels, monkeypatch):
    """The artifacts intact by their stamps are known to be there and final (a stamp lists the provisional
    marker where there is one): the store is asked only about the edited candidate's tasks, what depends
    on them, and what those read (their gates' verdicts), not about each of the project's tasks."""
    from magpie.execution.build import Build, BuildOptions

    root = twelve_kernels
    manifest = root / "magpie.toml"
    build_all(manifest)
    source = root / "k4/v1.py"
    source.write_text(source.read_text() + "# edited again\n")
    asked = store_lookups(monkeypatch)
    build = Build(BuildOptions(manifest=manifest))
    plan = build.dry_run()
    project = build.project
    cone = ["compile:k4/v1", "correctness:k4/v1", "timing:k4/v1", "comparison:k4", "report"]
    assert [name for name, _ in plan.would_run] == cone
    reached = set(cone).union(*(project.tasks[name].deps for name in cone))
    # a task by its key now, or by the one it was last built under (a gate's last verdict is read from there)
    by_key = {(project.store.recorded(name) or {}).get("key"): name for name in project.tasks}
    by_key.update({spec.key: name for name, spec in project.tasks.items()})
    assert {by_key.get(key, key) for key in asked} <= reached
    assert len(reached) < len(project.tasks) // 2
    # the other tasks' bodies (inputs, settings, key parts) were never unmarshalled
    assert {name for name, spec in project.tasks.items() if "_body" not in vars(spec)} == set(cone)


def test_the_stale_tasks_found_by_stamps_are_those_the_store_gives(twelve_kernels):
    """staleness.runs (the artifacts intact by their stamps taken as there) gives what Project.stale
    gives asking the store about every task, after artifacts removed, one forced and a source edited."""
    from magpie.execution.build import check_artifacts, run_provisional_again
    from magpie.execution.staleness import closure, runs

    root = twelve_kernels
    manifest = root / "magpie.toml"
    build_all(manifest)
    source = root / "k2/v0.py"
    source.write_text(source.read_text() + "# a baseline edited\n")
    project = Project.load(manifest)
    for name in ("timing:k6/v2", "correctness:k9/v1", "comparison:k11"):
        project.store.remove(project.tasks[name].key)
    project.forced.add("compile:k1/v1")
    for selected in ([], ["comparison:k6"], ["timing:k2/v1", "report"]):
        covered = closure(project, project.select(selected))
        intact: set[str] = set()
        check_artifacts(project, covered, warn=print, remove=False, intact=intact)
        run_provisional_again(project, covered, intact)
        assert runs(project, covered, intact) == project.stale(covered)
        assert covered == [name for name in project.tasks if name in set(covered)]  # in run order


def test_the_no_op_snapshot_reads_provisional_marks_from_stamps_and_is_written_once_per_build(
    twelve_kernels, monkeypatch
):
    """A build takes the snapshot at load without writing it (the last one stays until the build is done),
    and writing it asks the store about no provisional marker: each artifact's stamp lists its files."""
    from magpie.graph import snapshot

    manifest = twelve_kernels / "magpie.toml"
    build_all(manifest)
    project = Project.load(manifest)
    written = snapshot.path_for(manifest, "workspaces")
    before = written.read_bytes() if written.exists() else None
    data = snapshot.taken(project)
    assert (written.read_bytes() if written.exists() else None) == before
    asked = store_lookups(monkeypatch)
    snapshot.save(project, data)
    assert asked == [] and written.exists()
    assert not any(task["provisional"] for task in data["tasks"].values())
    assert all(task["stamp"] for task in data["tasks"].values())
