"""The build as a library: `Build(options, progress).run()` brings a project's stale artifacts
up to date and returns what it did (`BuildResult`, its `BuildSummary` included); bad input
raises `UserError`. Nothing is printed but through the `Progress` the caller passes (stderr
for the CLI, nowhere by default); the CLI (cli/build.py) parses flags, calls, prints.

A build, in order: the fast no-op (the graph snapshot, one stat per artifact), the project
loaded, the artifacts it reads or publishes checked against their digests, the input secret
drawn, the sandbox admitted, the zygote session and the executor started, doit run over the
stale tasks, the results published (what was modified meanwhile rebuilt once more)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from magpie.errors import UserError
from magpie.execution.progress import Progress
from magpie.report.publish import PUBLISHED, publish, publish_project

if TYPE_CHECKING:
    from magpie.project import Project
    from magpie.report.models import BuildSummary

# Plain classes rather than dataclasses: this module is on the no-op build's path, which
# dataclasses' import (inspect's) would lengthen by a few milliseconds.


class BuildOptions:
    """What a build is asked to do; `magpie build`'s flags of the same names say each."""

    def __init__(
        self,
        *,
        targets: list[str] | None = None,
        manifest: str | Path = "magpie.toml",
        jobs: int = 1,
        executor: str | None = None,
        devices: list[int] | None = None,
        ray_address: str | None = None,
        force: bool = False,
        verify: bool = False,
        trust_code: bool = False,
        check: bool = False,
        summarize: bool = True,
        cache: str | None = None,
        cache_write: bool | None = None,
    ):
        self.targets = list(targets or [])  # kernel ids or task names; none: everything
        self.manifest = manifest
        self.jobs = jobs
        self.executor = executor  # "inline", "local" or "ray"; None: inline for one job, local otherwise
        self.devices = devices  # GPU indices jobs are placed on; None: [project] devices, else every visible GPU
        self.ray_address = ray_address  # with executor "ray": a cluster's ("auto", "ray://..."); None: Ray started here
        self.force = force  # the targets run again even where up to date
        self.verify = verify  # every artifact hashed first, not trusted by its files' stat
        self.trust_code = trust_code  # code under test runs unsandboxed where the host allows no sandbox
        self.check = check  # the result's exit code counts the check's problems (CI)
        # the result carries the build's summary (which reads the stored verdicts: the CLI asks
        # for it only with --json or --check, a no-op build otherwise reads no artifact)
        self.summarize = summarize or check
        self.cache = cache  # a shared cache's folder; None: [store] cache, else none
        self.cache_write = cache_write  # what was built is put into it; None: [store] cache_write


class BuildResult:
    """What a build did. `line`: it in one line (`magpie: 12 artifacts up to date`, `magpie: ran
    3 tasks, 0 failed; reports in ...`); `summary`: per implementation its verdict and the
    check (None unless asked for)."""

    def __init__(
        self,
        *,
        line: str,
        executed: list[str],
        failures: list[tuple[str, str]],
        tasks_failed: bool,
        summary: BuildSummary | None,
        check: bool,
    ):
        self.line = line
        self.executed = executed
        self.failures = failures  # (task, its last error line)
        self.tasks_failed = tasks_failed  # a task failed, or an artifact was modified again as it was published
        self.summary = summary
        self.check = check

    @property
    def up_to_date(self) -> bool:
        return not self.executed and not self.failures

    @property
    def check_passed(self) -> bool:
        return self.summary is None or self.summary.check.passed

    @property
    def exit_code(self) -> int:
        """`magpie build`'s: 1 where a task failed or, with check, the check failed; else 0."""
        return 1 if self.tasks_failed or (self.check and not self.check_passed) else 0


class DryRun:
    """What a build would run and why (`would_run`: (task, why), in run order), and how many
    of the project's tasks are up to date."""

    def __init__(self, would_run: list[tuple[str, str]], up_to_date: int):
        self.would_run = would_run
        self.up_to_date = up_to_date


class Build:
    """One build of a project. `run()` builds; `dry_run()` says what run() would run; while
    `stopped_by_sigterm()` holds, SIGTERM stops the build. Options are checked here: a bad
    one raises UserError before anything starts."""

    def __init__(self, options: BuildOptions, progress: Progress | None = None):
        if options.jobs < 1:
            raise UserError("--jobs: must be at least 1")
        if options.force and not options.targets:
            raise UserError("--force: name what to run again (task names such as timing:KERNEL/IMPL, or kernel ids)")
        self.options = options
        self.progress = progress or Progress()
        self.project: Project | None = None  # loaded by run() or dry_run()
        self._building = False  # from here on SIGTERM stops the build (before it: the signal's previous handling)
        self._previous_handler = None
        self._stopping = False

    def run(self) -> BuildResult:
        options = self.options
        self._admit_trusted_code()
        if not options.targets and not options.verify:
            result = up_to_date_by_snapshot(
                Path(options.manifest), summarize=options.summarize, check=options.check, progress=self.progress
            )
            if result is not None:
                return result
        from magpie.execution import pool
        from magpie.graph import snapshot

        pool.prestart(options.jobs, options.executor)  # its imports beside the project's loading
        project, saved, selected = self._load()
        refuse_on_read_only(project, selected)
        remote = None
        from magpie.graph.last_load import cache_declared

        # an up-to-date build reads no [store] setting; one after an edit reads it from the last load's record
        if options.cache is not None or (cache_declared(project) and project.stale(selected)):
            from magpie.execution.shared_cache import cache_of, take_from_cache

            remote = cache_of(project, options.cache, options.cache_write)
            if remote is not None:
                take_from_cache(project, selected, remote, self.progress)
        self._building = True
        try:
            result = build_selected(
                project,
                selected,
                jobs=options.jobs,
                executor_name=options.executor,
                devices=options.devices,
                ray_address=options.ray_address,
                progress=self.progress,
                verify=options.verify,
                summarize=options.summarize,
                check=options.check,
                ray_cluster=options.executor == "ray" and options.ray_address is not None,
            )
            if remote is not None and remote.writable:
                from magpie.execution.shared_cache import put_into_cache

                put_into_cache(project, selected, remote, self.progress)
            return result
        finally:
            self._building = False
            snapshot.save(project, saved)  # with the stamps of the artifacts checked or written

    def dry_run(self) -> DryRun:
        self._admit_trusted_code()
        project, _, selected = self._load(snapshot_taken=False)  # the no-op's snapshot is the build's to take
        return plan(project, selected, self.progress)

    def _admit_trusted_code(self) -> None:
        if self.options.trust_code:
            from magpie import sandbox

            sandbox.admit(True)

    def _load(self, snapshot_taken: bool = True):
        from magpie.graph import snapshot
        from magpie.project import Project

        project = Project.load(self.options.manifest)
        saved = None
        if snapshot_taken:  # written once the build is done (`run`)
            saved = snapshot.taken(project)
        else:  # the artifacts still trusted by their stat, as in a build
            snapshot.take_stamps(project)
        selected = project.select(self.options.targets)
        if self.options.force:
            project.forced.update(selected)
            selected = project.with_dependents(selected)
        self.project = project
        return project, saved, selected

    @contextlib.contextmanager
    def stopped_by_sigterm(self):
        """While the block runs, SIGTERM stops the build once it is building: no task starts or
        stores its artifact after it (one being stored is stored first), every process the
        build started is killed (a zygote kept warm for later builds excepted), one line names
        the tasks that were running (through the progress), and SystemExit(143) is raised where
        the main thread was. Before the build starts, the signal is handled as it was before
        the block. Outside the main thread, nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, self._previous_handler)

    def _on_sigterm(self, signum: int, _frame) -> None:
        if not self._building:  # nothing of the build's is running: the handling the block found
            signal.signal(signum, self._previous_handler if self._previous_handler is not None else signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        from magpie.execution.doit_glue import stop_storing

        if not self._stopping:  # a second signal while stopping changes nothing
            self._stopping = True
            stop_storing(lambda running: self._stopped(signum, running))

    def _stopped(self, signum: int, running: list[str]) -> None:
        import multiprocessing.resource_tracker as resource_tracker

        from magpie import environment
        from magpie.execution.executors import stop_descendants
        from magpie.supervision import scratch

        # The resource tracker is left to end by itself, after this process: it removes what
        # the process pool registered (its semaphores) and ends when no process holds its pipe.
        spare = {getattr(resource_tracker._resource_tracker, "_pid", None)}
        folder = os.environ.get(environment.ZYGOTE_DIR)
        if folder and not os.environ.get(environment.ZYGOTE_OWNER):  # kept warm: not this build's to stop
            for pid_file in Path(folder).glob("*.pid"):
                with contextlib.suppress(OSError, ValueError):
                    spare.add(int(pid_file.read_text()))
        stop_descendants(os.getpid(), frozenset(pid for pid in spare if pid))
        scratch.sweep()  # the folders of the processes just killed
        name = signal.Signals(signum).name
        project = self.project
        assert project is not None  # loaded before the build began, the only time this runs
        unstored = [task for task in running if not project.store.has(project.tasks[task].key)]
        self.progress.urgent(
            f"magpie: stopped by {name} while running {', '.join(unstored)}; nothing of them was stored"
            if unstored
            else f"magpie: stopped by {name}; no task was running"
        )
        raise SystemExit(128 + signum)


def refuse_on_read_only(project, selected: list[str]) -> None:
    """A build with something to store, on a workspace it cannot write, ends before it starts."""
    from magpie import workspace

    if workspace.writable(project.store.workspace):
        return
    stale = project.stale(selected)
    if stale:
        raise UserError(
            workspace.read_only_line(
                project.store.workspace,
                f"{len(stale)} stale tasks would store their artifacts there (first: {stale[0]})",
            )
        )


def plan(project, selected: list[str], progress: Progress | None = None) -> DryRun:
    """What a build of `selected` would run and why; nothing is run, removed or stored."""
    from magpie.execution.staleness import closure, stale_reasons
    from magpie.store import reason

    covered = closure(project, selected)
    intact: set[str] = set()
    checked = check_artifacts(project, covered, remove=False, warn=(progress or Progress()).line, intact=intact)
    modified = {name: reason(problem) for name, problem in checked.items()}
    project.forced.update(modified)  # a build removes and rebuilds them: so do their dependents
    again = run_provisional_again(project, covered, intact)
    rows = list(stale_reasons(project, selected, {**again, **modified}, covered, intact).items())  # in run order
    return DryRun(rows, len(project.tasks) - len(rows))


# Actions that start an evaluator: the build starts their zygote (importing torch) at once.
EVALUATING_ACTIONS = ("magpie:correctness", "magpie:timing")


def build_selected(
    project,
    selected: list[str],
    *,
    jobs: int = 1,
    executor_name: str | None = None,
    devices: list[int] | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    verify: bool = False,
    summarize: bool = True,
    check: bool = False,
    ray_cluster: bool = False,
) -> BuildResult:
    """Build `selected` (task names) of a loaded project, and what they depend on. `ray_cluster`:
    jobs run on a Ray cluster's nodes (what a measurement records of where it ran)."""
    from magpie.execution.doit_glue import closure, run_doit
    from magpie.execution.executors import make_executor
    from magpie.execution.staleness import runs
    from magpie.store import reason
    from magpie.supervision import zygote

    progress = progress or Progress()
    summarize = summarize or check
    project.store.sweep_temporaries()
    # what this build reads or publishes, checked first: a modified artifact is rebuilt
    published = [name for name, spec in project.tasks.items() if spec.rule in PUBLISHED]
    intact: set[str] = set()
    modified = check_artifacts(
        project,
        list(dict.fromkeys(closure(project, selected) + published)),
        trust_stamps=not verify,
        warn=progress.line,
        intact=intact,
    )
    selected = selected + [name for name in modified if name not in selected]
    covered = closure(project, selected)
    again = run_provisional_again(project, covered, intact)
    stale = runs(project, covered, intact)
    if not stale:
        bad = publish_project(project, progress.line)
        if not bad:
            return BuildResult(
                line=f"magpie: {len(selected)} artifacts up to date",
                executed=[],
                failures=[],
                tasks_failed=False,
                check=check,
                summary=_summary(project, selected, [], []) if summarize else None,
            )
        selected += [name for name in bad if name not in selected]  # modified since checked
        intact.difference_update(bad)
        covered = closure(project, selected)
        again.update(run_provisional_again(project, covered, intact))
        stale = runs(project, covered, intact)
    evaluates = any(project.tasks[name].action in EVALUATING_ACTIONS for name in stale)
    if evaluates or any(not project.tasks[name].action.startswith("magpie:") for name in stale):
        from magpie import sandbox
        from magpie.graph.last_load import trust_code

        sandbox.admit(trust_code(project))  # code under test runs: in a sandbox, or trusted
    why = {**again, **{name: reason(problem) for name, problem in modified.items()}}
    secret = input_secret(evaluates)
    with zygote.session(prestart=evaluates):  # before the executor: its job processes find the zygote's folder
        placed = _devices(project, stale, devices, progress)
        from magpie.execution.measured_on import Recording

        executor = Recording(make_executor(jobs, executor_name, placed, ray_address), ray_cluster)
        try:
            code, reporter = run_doit(project, selected, executor, jobs, progress, why, secret, covered, intact)
            republish = publish_project(project, progress.line)  # modified while this build ran: rebuilt once more
            if republish:
                more, second = run_doit(project, republish, executor, jobs, progress, secret=secret)
                reporter.executed += second.executed
                reporter.failures += second.failures
                code = code or more or (1 if publish_project(project, progress.line) else 0)
        finally:
            executor.shutdown()
    from magpie.report.verdicts import relative

    line = (
        f"magpie: ran {len(reporter.executed)} tasks, {len(reporter.failures)} failed; "
        f"reports in {relative(project.store.workspace / 'reports', project.root)}"
    )
    return BuildResult(
        line=line,
        executed=reporter.executed,
        failures=reporter.failures,
        tasks_failed=code != 0,
        check=check,
        summary=_summary(project, selected, reporter.executed, reporter.failures) if summarize else None,
    )


def _devices(project, stale: list[str], asked: list[int] | None, progress: Progress):
    """The devices the stale jobs are placed on (execution/devices.py); None where none is placed."""
    from magpie.execution.devices import CPU, PLACED_RULES, build_devices, device_of, models_line

    placed = [project.tasks[name] for name in stale if project.tasks[name].rule in PLACED_RULES]
    if not placed:
        return None
    if device_of(placed[0]) == "cpu":  # the manifest left unread (a load from the last one reads none)
        return [CPU]
    settings = project.manifest.project
    found = build_devices(settings.device, asked if asked is not None else settings.devices)
    line = models_line(found)
    if line:
        progress.line(line)
    return found


def run_provisional_again(project, closure: list[str], intact: set[str] | frozenset = frozenset()) -> dict[str, str]:
    """{task: why} for the tasks of `closure` whose stored results are not final (an
    inconclusive timing), marked forced: a build runs them again and replaces them. `intact`: the
    tasks `check_artifacts` found intact by their stamps (only those whose stamp lists a marker are read)."""
    from magpie.execution.staleness import maybe_provisional

    again = project.provisional(maybe_provisional(project, closure, set(intact)))
    project.forced.update(again)
    return again


def input_secret(evaluates: bool) -> str:
    """The secret a build mixes into every input seed (harness/spec.py), handed to its jobs with
    their work, never put in an environment: the one set in MAGPIE_INPUT_SECRET (it reproduces
    a build's inputs), else one of the build's own where it evaluates. Drawn per build: two
    builds in one process (a library caller, a server, a test) never repeat their inputs."""
    from magpie import environment

    given = os.environ.get(environment.INPUT_SECRET)
    if given is not None:
        return given
    if not evaluates:
        return ""
    import secrets

    return secrets.token_hex(16)


def _summary(project, selected: list[str], executed: list[str], failed: list[tuple[str, str]]) -> BuildSummary:
    """The summary of a build of `selected` (report/verdicts.py), from the stored artifacts."""
    from magpie.execution.staleness import closure
    from magpie.report.models import BuildSummary
    from magpie.report.verdicts import build_summary

    names = closure(project, selected)
    covered = [(name, project.tasks[name].rule, project.tasks[name].kernel, project.tasks[name].key) for name in names]
    done = set(executed) | {name for name, _ in failed}
    up_to_date = sum(1 for name, _, _, key in covered if name not in done and project.store.has(key))
    expected = {
        (kernel.id, impl.id)
        for kernel in project.manifest.kernel
        for impl in kernel.implementations()
        if impl.expect_faster
    }
    from magpie.execution.measured_on import mark_summary

    made = build_summary(
        project.root,
        project.store,
        covered,
        expected,
        executed=executed,
        failed=failed,
        up_to_date=up_to_date,
        uncompared=_uncompared(project, names),
    )
    return BuildSummary.model_validate(mark_summary(made, covered, project.store))


def _uncompared(project, closure: list[str]) -> list[dict]:
    """The comparisons of the kernels whose implementations' tasks `closure` covers but not their
    comparison (`magpie build timing:k/x`), made of the stored results as the comparison would."""
    from magpie.execution.actions import compare_results

    compared = {project.tasks[name].kernel for name in closure if project.tasks[name].rule == "comparison"}
    results: dict[str, dict[str, dict]] = {}
    for name in closure:
        spec = project.tasks[name]
        if (
            spec.kernel not in compared
            and spec.impl
            and spec.rule in ("compile", "correctness", "timing", "profile")
            and project.store.has(spec.key)
        ):
            results.setdefault(spec.kernel, {})[name] = project.store.read(spec.key)
    baselines = {project.tasks[name].kernel: project.tasks[name].params["baseline"] for name in closure}
    return [compare_results(kernel, found, baselines[kernel]) for kernel, found in sorted(results.items())]


def check_artifacts(
    project,
    names: list[str],
    *,
    warn: Callable[[str], None],
    trust_stamps: bool = True,
    remove: bool = True,
    intact: set[str] | None = None,
) -> dict[str, str]:
    """{task: problem} for the built artifacts among `names` whose files are not the ones
    recorded when they were written; each is announced in one line (to `warn`) and removed
    (so that the build rebuilds it) unless `remove` is false. An artifact whose files' stat is
    the one they had when its digest was last found right is not read again (unless not
    trust_stamps); those tasks are added to `intact`."""
    from magpie.store import warning

    store, found = project.store, {}
    for name in names:
        key = project.tasks[name].key
        if trust_stamps and store.unchanged(key, store.stamps.get(key)):
            if intact is not None:
                intact.add(name)
            continue  # intact by its files' stat: its folder's too
        if not store.has(key):
            continue
        problem = store.check(key, name, trust_stamps=trust_stamps)
        if problem is not None:
            found[name] = problem
            if remove:
                warn(warning(name, problem))
                store.remove(key)
    return found


def up_to_date_by_snapshot(
    manifest: Path, *, summarize: bool = False, check: bool = False, progress: Progress | None = None
) -> BuildResult | None:
    """The fast no-op: keys from the snapshot, one stat per artifact file, no manifest validation.
    None where the build is not a no-op by the snapshot. The summary (with `summarize` or
    `check`) is made of the stored comparisons."""
    from magpie.graph import snapshot
    from magpie.store import Store

    saved = snapshot.load_fresh(manifest)
    if saved is None:
        return None
    # the signers trusted when it was saved (the manifest's and the user's file are watched by it): an
    # artifact another trusted machine signed (taken from a shared cache) is published, not refused
    store = Store(Path(saved["workspace"]), trusted_signers=tuple(saved.get("trusted_signers", ())))
    tasks = saved["tasks"]
    if not all(store.unchanged(t["key"], t.get("stamp")) for t in tasks.values()):
        return None  # missing, or touched since its digest was checked: the full load checks it
    if any(t.get("provisional") for t in tasks.values()):
        return None  # a result not final (inconclusive): the full load runs it again
    covered = [(name, t["rule"], t["kernel"], t["key"]) for name, t in tasks.items()]
    if publish(store, covered, (progress or Progress()).line):
        return None  # one was modified (and is removed now): the full load rebuilds it
    summary = None
    if summarize or check:
        import tomllib

        from magpie.execution.measured_on import mark_summary
        from magpie.report.models import BuildSummary
        from magpie.report.verdicts import build_summary, expected_faster_in

        expected = expected_faster_in(tomllib.loads(manifest.read_text()))
        made = build_summary(
            manifest.resolve().parent, store, covered, expected, executed=[], failed=[], up_to_date=len(tasks)
        )
        summary = BuildSummary.model_validate(mark_summary(made, covered, store))
    return BuildResult(
        line=f"magpie: {len(tasks)} artifacts up to date",
        executed=[],
        failures=[],
        tasks_failed=False,
        summary=summary,
        check=check,
    )
