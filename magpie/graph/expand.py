"""Expand manifest x rules into tasks, each with a content key.

A task's key hashes the rule (and its action and version), the contents of its input
files, the resolved settings that affect it, the toolchain and device facts it names,
and, for each task it depends on, that task's key and the digest of the artifact it
produced (the result it reads). A result is not a pure function of its key (a timing is
measured, a correctness check draws fresh inputs), so a dependency re-run under the same
key (cleaned, forced, found modified) gives its dependents new keys: they rebuild, and a
re-measured timing reaches its comparison and the report. A task whose dependency has no
artifact yet has no artifact key until that dependency is built (`known()` is false); the up-to-date
check is then one `stat` of the store per task, plus one read of each dependency's
recorded digests on a full load (`resolve_key`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from magpie.errors import UserError
from magpie.paths import templates_dir
from magpie.store.digests import SETTLED_S, FileDigests

# Expanding imports pydantic's models and the harness; a load from the last one (graph/last_load.py)
# needs only TaskSpec, FileHasher and the key functions, and none of those imports.
if TYPE_CHECKING:
    from magpie.graph.rules import Rule
    from magpie.manifest.models import BenchmarkSpec, Implementation, Kernel, Manifest, TraceSet

# The key of a task whose dependency has no artifact yet: its recipe's hash behind a prefix that
# no stored key has (they are hex digests), so the task is stale, and two recipes still differ.
UNKNOWN_PREFIX = "unknown-"


def known(key: str) -> bool:
    return not key.startswith(UNKNOWN_PREFIX)


@dataclass
class TaskSpec:
    """Plain, picklable data: everything an executor needs to run one task."""

    name: str
    rule: str
    scope: str
    action: str
    kernel: str | None
    impl: str | None
    inputs: list[str]
    config: dict
    fingerprint: dict
    deps: list[str]
    params: dict
    key: str = UNKNOWN_PREFIX  # resolve_key's
    parts: dict = field(default_factory=dict)
    after: list[str] = field(default_factory=list)  # order only: not in the key, results not read

    @property
    def is_builtin(self) -> bool:
        return self.action.startswith("magpie:")


class FileHasher:
    """sha256 of file contents, computed once per file per process. With a snapshot folder,
    the bytes hashed are kept there under their digest: a job reads the code it was keyed by
    from there, not from a file that may have been edited since (`snapshot_path`). Files over
    `LARGE_FILE_BYTES` (a model's weights) are neither kept nor read whole: their digests are
    streamed and remembered by stat in `digests` (`magpie.store.digests`).

    `remembered` (path -> [stat identity, digest], the last load's `remembered`): a file whose
    stat is the one it had when hashed takes that digest unread (its kept bytes still there).
    What this hasher found is in `remembered` afterwards, a file only once settled (its mtime and
    ctime `SETTLED_S` old when hashing began, its stat unmoved by the read), as `digests.py` does."""

    def __init__(
        self,
        snapshots: Path | None = None,
        digests: FileDigests | None = None,
        remembered: dict[str, list] | None = None,
    ):
        self._cache: dict[str, str] = {}
        self.snapshots = snapshots
        self.digests = digests if digests is not None else FileDigests(None)
        self._last = remembered or {}
        self.remembered: dict[str, list] = {}

    def __call__(self, path: Path) -> str:
        spath = str(path)
        digest = self._cache.get(spath)
        if digest is None:
            digest = self._unread(spath) or self._hashed(spath)
            self._cache[spath] = digest
        return digest

    def _unread(self, path: str) -> str | None:
        entry = self._last.get(path)
        if not entry or stat_identity(path) != entry[0]:
            return None
        digest = entry[1]
        if self.snapshots is not None and entry[0][2] <= LARGE_FILE_BYTES:
            if not snapshot_path(self.snapshots, digest).exists():  # kept bytes removed: read it again
                return None
        self.remembered[path] = entry
        return digest

    def _hashed(self, path: str) -> str:
        before = stat_identity(path)
        started_ns = time.time_ns()
        digest = file_digest(Path(path), self.digests, self.snapshots)
        if (
            before is not None
            and started_ns - max(before[3], before[4]) >= SETTLED_S * 1e9
            and stat_identity(path) == before
        ):
            self.remembered[path] = [before, digest]
        return digest


def stat_identity(path: str) -> list[int] | None:
    """What a file's content is trusted unchanged by: device, inode, size, mtime_ns, ctime_ns
    (symlinks followed); None where there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


LARGE_FILE_BYTES = 16 << 20


def file_digest(path: Path, digests: FileDigests, snapshots: Path | None = None) -> str:
    """A task input's digest ("missing" when there is no such file); small files' bytes kept in `snapshots`."""
    try:
        if os.stat(path).st_size > LARGE_FILE_BYTES:
            return digests.digest(path)
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return "missing"
    digest = hashlib.sha256(data).hexdigest()
    if snapshots is not None:
        _keep(snapshot_path(snapshots, digest), data)
    return digest


def snapshot_path(snapshots: Path, digest: str) -> Path:
    return Path(snapshots) / digest[:2] / digest


def _keep(path: Path, data: bytes) -> None:
    if not path.exists():
        from magpie.store import atomic_write

        atomic_write(path, data)


def input_path(root: Path, name: str) -> Path:
    """Where a task's input of this name lives now."""
    if name.startswith("magpie-templates/"):
        return templates_dir() / name.split("/", 1)[1]
    return Path(root) / name


def changed_inputs(root: Path, parts: dict, digests: FileDigests | None = None) -> list[str]:
    """The inputs whose bytes are no longer those the task's key was computed from."""
    digests = digests if digests is not None else FileDigests(None)
    return [
        name
        for name, digest in parts.get("inputs", {}).items()
        if file_digest(input_path(root, name), digests) != digest
    ]


def resolved_settings(manifest: Manifest, kernel: Kernel, impl: Implementation) -> dict:
    from magpie.harness.timed_shapes import timed_selection

    d = manifest.defaults
    timing = (kernel.timing or d.timing).model_dump()
    timed_shapes = timing.pop("shapes")  # keyed as what is timed, under "timed"
    # the wire's name for who times (`harness/wire.TimingSettings`), and the timing's key as it was before
    # `timing.timed_by` was the manifest's
    timing["vouched"] = timing.pop("timed_by") == "evaluator"
    testcases = []
    for tc in kernel.testcases:
        item = tc.model_dump(exclude_none=True)
        if tc.spec:
            item.update(
                rtol=tc.rtol if tc.rtol is not None else (kernel.rtol if kernel.rtol is not None else d.rtol),
                atol=tc.atol if tc.atol is not None else (kernel.atol if kernel.atol is not None else d.atol),
                trials=tc.trials or kernel.trials or d.trials,
            )
        testcases.append(item)
    limits = {"timeout_s": kernel.timeout_s or d.timeout_s, "memory_mb": d.memory_mb}
    return {
        "compile": {
            "env": impl.env,
            "working_dir": impl.working_dir,
            "compile_command": impl.compile_command,
            **({"arch": cuda_arch(manifest)} if kernel.impl_type(impl) == "cuda" else {}),
        },
        "correctness": {"testcases": testcases, "seed": d.seed, "entry": impl.entry or kernel.entry, **limits},
        # what a timing depends on of the testcases (`timed_shapes.timed_selection`), not all of them: a shape
        # added to be checked re-runs correctness, not the timings
        "timing": {
            **timing,
            **limits,
            "timed": {
                **timed_selection(kernel.id, testcases, timed_shapes),
                "seed": d.seed,
                "entry": impl.entry or kernel.entry,
            },
        },
        "profile": d.profile.model_dump(),
        "project": {"device": manifest.project.device},
    }


def cuda_arch(manifest: Manifest) -> str:
    if manifest.project.cuda_arch:
        return manifest.project.cuda_arch
    from magpie.graph.fingerprint import gpu_description

    gpu = gpu_description()
    return gpu[1] if gpu else "sm_90"


def _repeats(bench: BenchmarkSpec) -> int:
    from magpie.manifest.sweep_axes import DEFAULT_REPEATS

    return bench.repeats or DEFAULT_REPEATS


def _impl_params(kernel: Kernel, impl: Implementation | None) -> dict | None:
    if impl is None:
        return None
    return {
        "id": impl.id,
        "type": kernel.impl_type(impl),
        "source": impl.source,
        "source_files": list(impl.source_files),
        "entry": impl.entry or kernel.entry,
        "working_dir": impl.working_dir,
        "env": dict(impl.env),
        "is_baseline": kernel.baseline is not None and impl.id == kernel.baseline.id,
    }


class Expander:
    def __init__(self, manifest: Manifest, root: Path, rules: list[Rule], hasher: FileHasher | None = None):
        self.manifest = manifest
        self.root = root
        self.rules = rules
        self.hash_file = hasher or FileHasher()
        self.device = manifest.project.device
        self.tasks: dict[str, TaskSpec] = {}
        self._parts: dict[tuple, object] = {}
        self.unit_tasks: dict[str, list[str]] = {}  # a swept benchmark's unit name: its points' tasks

    # -- inputs -----------------------------------------------------------------------------
    def _placeholder_files(
        self,
        name: str,
        kernel: Kernel | None,
        impl: Implementation | None,
        trace: TraceSet | None = None,
        bench: BenchmarkSpec | None = None,
    ) -> list[str]:
        from magpie.harness.declared import spec_inputs

        baseline = kernel.baseline if kernel else None
        table = {
            "trace.files": lambda: self._trace_files(trace) if trace else [],
            "benchmark.model_files": lambda: self._model_files(bench) if bench else [],
            "impl.source": lambda: [impl.source] if impl else [],
            "impl.source_files": lambda: list(impl.source_files) if impl else [],
            "baseline.source": lambda: [baseline.source] if baseline else [],
            "baseline.source_files": lambda: list(baseline.source_files) if baseline else [],
            "testcase.specs": lambda: spec_inputs(self.root, kernel) if kernel else [],
            "templates": lambda: ["magpie-templates/" + p.name for p in sorted(templates_dir().glob("*.j2"))],
        }
        if name not in table:
            raise UserError(f"rule input {{{name}}}: unknown placeholder (known: {', '.join(table)})")
        return table[name]()

    def _trace_files(self, trace: TraceSet) -> list[str]:
        folder = self.root / trace.dir
        found = [p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))]
        return sorted(p.relative_to(self.root).as_posix() for p in found)

    def _model_files(self, bench: BenchmarkSpec) -> list[str]:
        """A local model folder's files (project-relative where inside the project), so the benchmark's
        key holds the model's content; nothing for a hub id or a model that is not here."""
        from magpie.serving.report import local_model_path

        path = local_model_path(str(self.root / bench.model)) if not Path(bench.model).is_absolute() else None
        if path is None or not path.exists():
            path = local_model_path(bench.model)
        if path is None or not path.exists():
            return []
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        root = self.root.resolve()
        return sorted(p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p) for p in found)

    def _inputs(
        self, rule: Rule, kernel, impl, trace: TraceSet | None = None, bench: BenchmarkSpec | None = None
    ) -> list[str]:
        files: list[str] = []
        for pattern in rule.inputs:
            if pattern.startswith("{") and pattern.endswith("}") and pattern.count("{") == 1:
                names = self._placeholder_files(pattern[1:-1], kernel, impl, trace, bench)
            else:
                names = [pattern]
            files.extend(n for n in names if n not in files)
        return files

    def _input_path(self, name: str) -> Path:
        return input_path(self.root, name)

    def _fingerprint(self, rule: Rule) -> dict:
        from magpie.graph.fingerprint import fingerprint

        return self._shared(
            ("fingerprint", id(rule)), lambda: {f: fingerprint(f, self.device) for f in rule.fingerprint}
        )

    def _shared(self, what: tuple, make):
        """One object for every task whose part is alike (a rule's identity, an implementation's settings):
        the last load (graph/last_load.py) writes it once. Read only: never changed in place."""
        found = self._parts.get(what)
        if found is None:
            found = self._parts[what] = make()
        return found

    # -- expansion --------------------------------------------------------------------------
    def expand(self) -> dict[str, TaskSpec]:
        order = {"implementation": 0, "kernel": 1, "trace": 1, "benchmark": 1, "project": 2}
        device_kind = self.device.split(":", 1)[0]
        for rule in sorted(self.rules, key=lambda r: order[r.scope]):
            if device_kind not in rule.devices:
                continue
            if rule.scope == "implementation":
                for kernel in self.manifest.kernel:
                    for impl in kernel.implementations():
                        if kernel.impl_type(impl) in rule.types:
                            self._add(rule, kernel, impl)
            elif rule.scope == "kernel":
                for kernel in self.manifest.kernel:
                    self._add(rule, kernel, None)
            elif rule.scope == "trace":
                for trace in self.manifest.traces:
                    self._add_trace(rule, trace)
            elif rule.scope == "benchmark":
                for bench in self.manifest.benchmark:
                    self._add_benchmark(rule, bench)
            else:
                self._add(rule, None, None)
        for spec in self.tasks.values():
            spec.deps = [d for d in self._unaliased(spec.deps) if d in self.tasks]
            spec.after = [d for d in self._unaliased(spec.after) if d in self.tasks and d not in spec.deps]
        ordered: dict[str, TaskSpec] = {}
        for name in self.tasks:
            self._in_run_order(name, ordered, set())
        for spec in ordered.values():
            spec.parts = self._own_parts(spec)
        self.tasks = ordered
        return self.tasks

    def _unaliased(self, names: list[str]) -> list[str]:
        """Names with a swept benchmark's unit name (`benchmark:<id>`) replaced by its points' tasks."""
        out: list[str] = []
        for name in names:
            for task in self.unit_tasks.get(name, [name]):
                if task not in out:
                    out.append(task)
        return out

    def _add(self, rule: Rule, kernel: Kernel | None, impl: Implementation | None) -> None:
        if kernel is not None and impl is not None:
            name = f"{rule.name}:{kernel.id}/{impl.id}"
        elif kernel is not None:
            name = f"{rule.name}:{kernel.id}"
        else:
            name = rule.name
        if kernel is not None and impl is not None:
            settings = self._shared(
                ("settings", kernel.id, impl.id), lambda: resolved_settings(self.manifest, kernel, impl)
            )
        elif kernel is not None:
            settings = {"project": {"device": self.device}}
        else:
            # The report prints the project's name: renaming the project must rebuild it, and
            # only it (the name is in no other task's settings).
            settings = {"project": {"device": self.device, "name": self.manifest.project.name}}
        config = {section: settings[section] for section in rule.config if section in settings}
        if rule.builtin_action is None and impl is not None and rule.name == "compile" and impl.compile_command:
            action = impl.compile_command
        else:
            action = rule.action
        self.tasks[name] = TaskSpec(
            name=name,
            rule=rule.name,
            scope=rule.scope,
            action=action,
            kernel=kernel.id if kernel else None,
            impl=impl.id if impl else None,
            inputs=self._inputs(rule, kernel, impl),
            config=config,
            fingerprint=self._fingerprint(rule),
            deps=self._deps(rule, kernel, impl),
            after=self._deps(rule, kernel, impl, rule.after),
            params={
                "root": str(self.root),
                "rule_identity": self._shared(("rule", id(rule)), rule.identity),
                "description": rule.description,
                "gates": self._deps(rule, kernel, impl, rule.gates),
                "impl": self._shared(("impl", kernel.id, impl and impl.id), lambda: _impl_params(kernel, impl))
                if kernel
                else None,
                "baseline": self._shared(("baseline", kernel.id), lambda: _impl_params(kernel, kernel.baseline))
                if kernel
                else None,
                "settings": settings,
                "project": self.manifest.project.name,
                "snapshots": str(self.hash_file.snapshots) if self.hash_file.snapshots else None,
            },
        )

    def _add_trace(self, rule: Rule, trace: TraceSet) -> None:
        settings = {"trace": trace.model_dump(), "project": {"device": self.device}}
        self._add_unit(rule, f"{rule.name}:{trace.id}", settings, self._inputs(rule, None, None, trace), trace.id)

    def _add_benchmark(self, rule: Rule, bench: BenchmarkSpec) -> None:
        from magpie.serving import engines

        if rule.when is not None and not getattr(bench, rule.when.split(".", 1)[1]):
            return
        # Keyed by what the run measures: the config (not where the server listens, nor whether a profiled
        # run is declared beside it: that one is a task of its own, nor whether a kept server may serve it: the
        # report's provenance says whether one did), the engine's version (installed package metadata; in docker
        # mode the image's content id instead) and, through the inputs, the model folder's content.
        keyed = bench.model_dump(
            mode="json", exclude={"id", "host", "port", "profiler", "keep_server", "sweep", "repeats", "use", "ab"}
        )
        if rule.when == "benchmark.use":
            # the A/B's own: what is put in, where, and how it is judged; the implementations' sources and
            # verdicts reach its key through the used kernels' comparisons, its only deps
            kernels = {k.id: k for k in self.manifest.kernel}
            keyed.update(
                use=dict(bench.use),
                ab=bench.ab.model_dump(mode="json"),
                replaces={k: [kernels[k].replaces, kernels[k].replaces_with or kernels[k].entry] for k in bench.use},
            )
        if bench.run_mode == "docker":
            from magpie.serving.docker_mode import image_id

            keyed["image_id"] = image_id(bench.engine, bench.docker_image)
        else:
            keyed["engine_version"] = engines.get(bench.engine).version()
        if bench.sweep is not None and rule.name == "benchmark":
            self._add_sweep_points(rule, bench, keyed)
            return
        if bench.sweep is not None:  # the sweep's own node: keyed by all its points (its deps)
            keyed.update(sweep=bench.sweep.model_dump(mode="json", exclude_none=True), repeats=_repeats(bench))
        settings = {"benchmark": keyed, "project": {"device": self.device}}
        self._add_unit(
            rule,
            f"{rule.name}:{bench.id}",
            settings,
            self._inputs(rule, None, None, bench=bench),
            bench.id,
            benchmark=bench.model_dump(mode="json"),
        )
        if rule.when == "benchmark.use":
            # only the used kernels' comparisons; their implementations' sources are inputs too, so the engine
            # loads the bytes the key was made of (kept in the snapshots by their digest)
            task = self.tasks[f"{rule.name}:{bench.id}"]
            used = {f"comparison:{k}" for k in bench.use}
            task.deps = [d for d in task.deps if not d.startswith("comparison:") or d in used]
            kernels = {k.id: k for k in self.manifest.kernel}
            task.params["replacing"] = {
                k: {
                    "target": kernels[k].replaces,
                    "function": kernels[k].replaces_with or kernels[k].entry,
                    "sources": {impl.id: impl.source for impl in kernels[k].implementations()},
                }
                for k in bench.use
            }
            for k in bench.use:
                task.inputs += [f for f in task.params["replacing"][k]["sources"].values() if f not in task.inputs]

    def _add_sweep_points(self, rule: Rule, bench: BenchmarkSpec, keyed: dict) -> None:
        """One task per sweep point (`benchmark:<id>/concurrency-4`), keyed by its own load alone, so adding a
        value adds only its points' tasks; each waits for the one before (one server serves them in turn). The
        unit's name (`benchmark:<id>`) stands for all of them in other tasks' deps."""
        from magpie.manifest.sweep_axes import task_label

        assert bench.sweep is not None
        names: list[str] = []
        for point in bench.sweep.points():
            values = {axis: "inf" if value == float("inf") else value for axis, value in point.items()}
            load = {**keyed["load"], **values}
            name = f"{rule.name}:{bench.id}/{task_label(point)}"
            settings = {"benchmark": {**keyed, "load": load, "repeats": _repeats(bench)}}
            self._add_unit(
                rule,
                name,
                {**settings, "project": {"device": self.device}},
                self._inputs(rule, None, None, bench=bench),
                bench.id,
                benchmark={**bench.model_dump(mode="json"), "load": load},
                point=values,
                repeats=_repeats(bench),
            )
            if names:
                self.tasks[name].after.append(names[-1])
            names.append(name)
        self.unit_tasks[f"{rule.name}:{bench.id}"] = names

    def _add_unit(self, rule: Rule, name: str, settings: dict, inputs: list[str], unit: str, **params) -> None:
        """A task of a rule whose scope is one declared unit (a trace set, a benchmark) of id `unit`."""
        self.tasks[name] = TaskSpec(
            name=name,
            rule=rule.name,
            scope=rule.scope,
            action=rule.action,
            kernel=None,
            impl=None,
            inputs=inputs,
            config={section: settings[section] for section in rule.config if section in settings},
            fingerprint=self._fingerprint(rule),
            deps=self._deps(rule, None, None, unit=unit),
            after=self._deps(rule, None, None, rule.after, unit),
            params={
                "root": str(self.root),
                "rule_identity": self._shared(("rule", id(rule)), rule.identity),
                "description": rule.description,
                "impl": None,
                "baseline": None,
                "settings": settings,
                "project": self.manifest.project.name,
                # the workspace's (None when read-only): a failed benchmark keeps its run's logs beside it
                "snapshots": str(self.hash_file.snapshots) if self.hash_file.snapshots else None,
                **params,
            },
        )

    def _deps(self, rule: Rule, kernel, impl, deps: list[str] | None = None, unit: str | None = None) -> list[str]:
        out: list[str] = []

        def add(name):
            if name not in out:
                out.append(name)

        for dep in rule.deps if deps is None else deps:
            if dep.startswith("baseline."):
                if kernel is not None and kernel.baseline is not None:
                    add(f"{dep[9:]}:{kernel.id}/{kernel.baseline.id}")
            elif dep.startswith("impls."):
                kernels = [kernel] if kernel is not None else self.manifest.kernel
                for k in kernels:
                    for i in k.implementations():
                        add(f"{dep[6:]}:{k.id}/{i.id}")
            elif dep.startswith("all."):  # every implementation of every kernel, whatever the scope
                for k in self.manifest.kernel:
                    for i in k.implementations():
                        add(f"{dep[4:]}:{k.id}/{i.id}")
            elif dep.startswith("kernels."):
                for k in self.manifest.kernel:
                    add(f"{dep[8:]}:{k.id}")
            elif dep.startswith("traces."):
                for t in self.manifest.traces:
                    add(f"{dep[7:]}:{t.id}")
            elif dep.startswith("benchmarks."):
                for b in self.manifest.benchmark:
                    add(f"{dep[11:]}:{b.id}")
            elif impl is not None:
                add(f"{dep}:{kernel.id}/{impl.id}")
            elif kernel is not None:
                add(f"{dep}:{kernel.id}")
            elif unit is not None:
                add(f"{dep}:{unit}")
            else:
                add(dep)
        self_name = f"{rule.name}:{kernel.id}/{impl.id}" if impl is not None else None
        return [d for d in out if d != self_name]

    def _in_run_order(self, name: str, ordered: dict, visiting: set) -> None:
        """Add `name` to `ordered` after what it depends on or waits for: the order a build at
        -j 1 runs them in (doit runs a task's deps first, in the order given)."""
        if name in ordered:
            return
        if name in visiting:
            raise UserError(f"rules form a cycle through {name}: check the rules' deps")
        visiting.add(name)
        spec = self.tasks[name]
        for dep in spec.deps + spec.after:
            self._in_run_order(dep, ordered, visiting)
        visiting.discard(name)
        ordered[name] = spec

    def _own_parts(self, spec: TaskSpec) -> dict:
        """What of the key the task's own declaration gives; its deps' part is `resolve_key`'s."""
        return {
            "task": spec.name,
            "rule": spec.params["rule_identity"],
            "action": spec.action,
            "inputs": {n: self.hash_file(self._input_path(n)) for n in spec.inputs},
            "config": spec.config,
            "fingerprint": spec.fingerprint,
        }


# A gate (a rule's `gates`): a dependency whose result keys the task by its verdict alone, in place of
# [its key, its artifact's digest]; `result_digest(name + VERDICT, key)` asks for that verdict.
GATE = "verdict"
VERDICT = "#verdict"


def resolve_key(spec: TaskSpec, tasks: dict[str, TaskSpec], result_digest) -> str:
    """Sets and returns the task's key from its own parts and, per dependency, [its key, the
    digest of its artifact] (`result_digest(name, key)`, None when it has none), as the store
    holds them now; not `known()` while a dependency has no artifact or no key. Dependencies
    come first in `tasks` (run order), so resolving in that order resolves everything."""
    deps = {}
    gates = spec.params.get("gates") or ()
    for dep in spec.deps:
        key = tasks[dep].key
        if dep in gates:  # its verdict alone: run again to the same verdict, it re-keys nothing
            deps[dep] = [GATE, result_digest(dep + VERDICT, key)]
            continue
        deps[dep] = [key, result_digest(dep, key) if known(key) else None]
    parts = {name: value for name, value in spec.parts.items() if name != "deps"}
    parts["deps"] = deps
    spec.parts = parts
    complete = all(digest is not None for _, digest in deps.values())
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    spec.key = digest if complete else UNKNOWN_PREFIX + digest
    return spec.key


def expand(
    manifest: Manifest,
    root: Path,
    rules: list[Rule],
    snapshots: Path | None = None,
    digests: FileDigests | None = None,
    hasher: FileHasher | None = None,
) -> dict[str, TaskSpec]:
    """The tasks with their own parts of the key; keys resolved with no store, except with a `hasher`
    (a Project's load: it resolves them from its store)."""
    tasks = Expander(manifest, Path(root), rules, hasher or FileHasher(snapshots, digests)).expand()
    if hasher is None:
        for spec in tasks.values():  # with no store: the keys of tasks without dependencies (Project's has one)
            resolve_key(spec, tasks, lambda name, key: None)
    digests = hasher.digests if hasher is not None else digests
    if digests is not None:
        try:
            digests.save()
        except OSError as err:  # a cache: on a read-only or full workspace the next load hashes again
            from magpie.workspace import unwritable

            if not unwritable(err):
                raise
    return tasks


def resolve_changed(
    tasks: dict[str, TaskSpec],
    last: dict[str, tuple[str, dict]],
    dirty: set[str],
    moved: set[str],
    result_digest,
    rekeyed=lambda name: None,
) -> set[str]:
    """Keys resolved again only where they may differ from the last load's (`last`: task -> its key and
    parts then): a task new, in `dirty` (its own part of the key changed), whose dependencies are not the
    recorded ones, or with a dependency re-keyed or in `moved` (its artifact committed again or removed
    since); the others keep their recorded key and parts. A dependency's digest is read from the store
    only where it may have changed. `rekeyed(name)` is called once a task's key changed, before what
    depends on it is resolved. Returns the tasks re-keyed or moved: one pass in run order, each edge once."""
    changed: set[str] = set()
    for name, spec in tasks.items():
        before = last.get(name)
        recorded = before[1].get("deps", {}) if before is not None else {}
        if before is None or name in dirty or list(recorded) != spec.deps or not changed.isdisjoint(spec.deps):

            def digest(dep: str, key: str, recorded: dict = recorded) -> str | None:
                then = recorded.get(dep)
                if dep not in changed and then is not None and then[0] == key:
                    return then[1]
                return result_digest(dep, key)

            resolve_key(spec, tasks, digest)
            if before is None or spec.key != before[0]:
                changed.add(name)
                rekeyed(name)
        else:
            spec.key, spec.parts = before
        if name in moved:
            changed.add(name)
    return changed


def explain(parts: dict, recorded: dict | None, first: set[str] | frozenset = frozenset(), forced: bool = False) -> str:
    """Why a task must run, comparing its key's parts with those of its last build; `first`:
    its dependencies that run before it in this build."""
    if forced:
        return "forced (--force)"
    if recorded is None:
        return "never built"
    old = recorded.get("parts", {})
    reasons = []
    for name, digest in parts["inputs"].items():
        before = old.get("inputs", {}).get(name)
        if before is None:
            reasons.append(f"new input {name}")
        elif before != digest:
            reasons.append(f"{name} changed")
    for section in ("rule", "action"):
        if parts[section] != old.get(section):
            reasons.append(f"{section} changed")
    for section, value in parts["config"].items():
        if value != old.get("config", {}).get(section):
            reasons.append(f"{section} settings changed")
    for fact, value in parts["fingerprint"].items():
        if value != old.get("fingerprint", {}).get(fact):
            reasons.append(f"{fact} changed")
    for dep, (key, digest) in parts["deps"].items():
        before = old.get("deps", {}).get(dep)
        if not isinstance(before, list) or not known(key) or key != before[0]:
            reasons.append(f"{dep} rebuilt")
        elif dep in first:  # the same key, run again: its result will be another
            reasons.append(f"{dep} {_redone(dep)} first")
        elif digest != before[1]:
            reasons.append(f"{dep} was {_redone(dep)}")
    if not reasons:
        return "artifact missing from the store"
    return ", ".join(reasons[:4]) + (f" (+{len(reasons) - 4} more)" if len(reasons) > 4 else "")


def _redone(task: str) -> str:
    return "re-measured" if task.startswith("timing:") else "re-run"
