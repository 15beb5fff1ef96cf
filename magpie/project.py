"""A loaded project: manifest, rules, expanded tasks and the store they build into."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from magpie.graph.expand import VERDICT, TaskSpec, expand, known, resolve_key
from magpie.store import Store
from magpie.workspace import writable

if TYPE_CHECKING:  # pydantic's models: a load from the last one (graph/last_load.py) reads no manifest
    from magpie.manifest.models import Manifest


@dataclass
class Project:
    # None where the tasks came from the last load (graph/last_load.py): read when first asked for
    loaded_manifest: Manifest | None
    root: Path
    manifest_path: Path
    tasks: dict[str, TaskSpec]  # in run order: a task after its deps
    store: Store
    forced: set[str] = field(default_factory=set)  # run again even where their artifacts are stored
    rebuilt: set[str] = field(default_factory=set)  # tasks this process ran: their dependents' keys change
    last_load: dict | None = None  # what this load leaves for the next (graph/last_load.py)
    last_load_changed: bool = False  # whether it differs from the one it came from

    @property
    def manifest(self) -> Manifest:
        if self.loaded_manifest is None:
            from magpie.manifest.load import load_manifest

            self.loaded_manifest = load_manifest(self.manifest_path)[0]
        return self.loaded_manifest

    @classmethod
    def load(cls, manifest_path: str | Path, workspace: str | Path | None = None) -> Project:
        """With the manifest's own workspace, from the last load where only input files changed since
        (graph/last_load.py), and left for the next."""
        from magpie.graph import last_load

        record = last_load.read(Path(manifest_path)) if workspace is None else None
        project = last_load.reuse(record, Path(manifest_path), cls) if record is not None else None
        if project is None:
            from magpie.manifest.load import load_manifest

            manifest, root = load_manifest(manifest_path)
            project = cls.from_manifest(manifest, root, Path(manifest_path), workspace, record)
        if workspace is None and project.last_load_changed:
            last_load.save(project)
        return project

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        root: Path,
        manifest_path: Path,
        workspace: str | Path | None = None,
        last: dict | None = None,
    ) -> Project:
        """`last`: the last load (graph/last_load.py), whose input digests and keys are reused where they hold."""
        from magpie.graph import last_load
        from magpie.graph.expand import FileHasher
        from magpie.graph.rules import resolve_rules

        _check_trace_folders(manifest, root, manifest_path)
        _check_benchmark_models(manifest, root, manifest_path)
        rules = resolve_rules(manifest.rule, manifest_path)
        store = Store(
            Path(workspace) if workspace else root / manifest.project.workspace,
            trusted_signers=tuple(manifest.store.trusted_signers),
        )
        # the bytes of inputs are kept for the jobs that run; on a read-only workspace none can
        snapshots = store.snapshots if writable(store.workspace) else None
        hasher = FileHasher(snapshots, store.file_digests, last["remembered"] if last else None)
        tasks = expand(manifest, root, rules, hasher=hasher)
        project = cls(manifest, root, manifest_path, tasks, store)
        if snapshots is None:
            project.resolve_keys()
        else:
            last_load.resolve_from(project, hasher, last)
        return project

    def resolve_keys(self) -> None:
        """Every task's key from the artifacts its dependencies have in the store now."""
        for spec in self.tasks.values():
            resolve_key(spec, self.tasks, self.result_digest)

    def resolve(self, name: str) -> str:
        """One task's key, its dependencies' keys taken as they are (resolved already)."""
        return resolve_key(self.tasks[name], self.tasks, self.result_digest)

    def result_digest(self, name: str, key: str) -> str | None:
        """The digest of what the task's artifact holds: of its files' recorded digests; None without one.
        For a gate (`name` ending in expand.VERDICT): its verdict (`result_verdict`)."""
        if name.endswith(VERDICT):
            return self.result_verdict(name.removesuffix(VERDICT), key)
        files = self.store.expected(key, name) if self.store.has(key) else None
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest() if files else None

    def result_verdict(self, name: str, key: str) -> str | None:
        """What a gate reads of a task's result, its `correctness_state`: from its artifact under `key`;
        where it has none yet (it runs in this build), from its last one, the verdict it is taken to
        keep until it has run (a dry run's forecast; the build keys its gated tasks again once it has
        run, `doit_glue.up_to_date`). None where it never had one."""
        last = (self.store.recorded(name) or {}).get("key")
        for stored in (key, last):
            if stored and known(stored) and self.store.has(stored):
                try:
                    return str(self.store.read(stored).get("correctness_state"))
                except (OSError, ValueError):
                    return None
        return None

    def select(self, names: list[str]) -> list[str]:
        """Task names for the given kernel ids or task names (all tasks when empty)."""
        if not names:
            return list(self.tasks)
        kernel_ids = {k.id for k in self.manifest.kernel}
        units = {"trace": {t.id for t in self.manifest.traces}, "benchmark": {b.id for b in self.manifest.benchmark}}
        selected = []
        for name in names:
            if name in self.tasks:
                selected.append(name)
            elif name in kernel_ids:
                selected.extend(t for t, spec in self.tasks.items() if spec.kernel == name)
            elif any(name in ids for ids in units.values()):  # a trace set's or benchmark's tasks
                selected.extend(
                    t for t, spec in self.tasks.items() if name in units.get(spec.scope, ()) and t.endswith(f":{name}")
                )
            else:
                from magpie.errors import UserError

                raise UserError(
                    f"{self.manifest_path}: no kernel, trace set, benchmark or task named {name!r} "
                    f"(kernels: {', '.join(sorted(kernel_ids)) or 'none'}; see magpie build --dry-run)"
                )
        return selected

    def with_dependents(self, names: list[str]) -> list[str]:
        """The tasks named and every task that depends on one of them, in run order."""
        found = set(names)
        for name, spec in self.tasks.items():
            if any(dep in found for dep in spec.deps):
                found.add(name)
        return [name for name in self.tasks if name in found]

    def stale(self, names: list[str] | None = None, provisional_forced: bool = False) -> list[str]:
        """The tasks among `names` and what they depend on that a build of them runs, in run
        order: forced, without an artifact under their key, with a provisional one (a result not
        final, `provisional`), or depending on one that runs (its new result gives them a new key).
        `provisional_forced`: the provisional ones are among `forced` already (`build.run_provisional_again`),
        not looked for again (one open per task)."""
        wanted = set(names or self.tasks)
        for name in reversed(list(self.tasks)):
            if name in wanted:
                wanted.update(self.tasks[name].deps)
        runs: set[str] = set()
        for name, spec in self.tasks.items():
            if name in wanted and (
                name in self.forced
                or not self.store.has(spec.key)
                or (not provisional_forced and self.store.provisional(spec.key) is not None)
                # a gate that runs changes this task's key only if its verdict changes (`resolve_key`)
                or any(dep in runs for dep in spec.deps if dep not in (spec.params.get("gates") or ()))
            ):
                runs.add(name)
        return [name for name in self.tasks if name in runs]

    def provisional(self, names: list[str]) -> dict[str, str]:
        """{task: why it runs again} for the tasks among `names` whose stored result is not final
        (an inconclusive timing): a build runs them again, replacing it, as if forced."""
        found = {}
        for name in names:
            marked = self.store.provisional(self.tasks[name].key)
            if marked is not None:
                found[name] = (
                    f"was {marked}: measured again" if name.startswith("timing:") else f"was {marked}: run again"
                )
        return found


def _check_benchmark_models(manifest: Manifest, root: Path, manifest_path: Path) -> None:
    """A benchmark's model written as a folder that is not there is refused before any server starts (an engine
    takes it for a hub id and spends its start failing). Written as a folder: a path (`./`, `/`, `~`, two
    slashes), or `a/b` whose `a` is a folder next to the manifest."""
    from magpie.errors import located

    for i, bench in enumerate(manifest.benchmark):
        model = bench.model
        if bench.base_url is not None or bench.engine == "external" or (root / os.path.expanduser(model)).exists():
            continue
        as_path = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
        if as_path or ("/" in model and (root / model.split("/", 1)[0]).is_dir()):
            raise located(
                manifest_path,
                f"benchmark[{i}].model",
                f"no model folder {model!r} next to the manifest: give the folder holding the model "
                f"(config.json, weights), relative to the manifest, or a hub id (org/name)",
            )


def _check_trace_folders(manifest: Manifest, root: Path, manifest_path: Path) -> None:
    from magpie.errors import located

    for i, trace in enumerate(manifest.traces):
        if not (root / trace.dir).is_dir():
            raise located(
                manifest_path,
                f"traces[{i}].dir",
                f"no folder {trace.dir!r} next to the manifest: give the folder of profiler traces",
            )
        for repo in trace.kernel_source_repos:
            if not (root / repo).is_dir():
                raise located(
                    manifest_path, f"traces[{i}].kernel_source_repos", f"no folder {repo!r} next to the manifest"
                )
