"""doit as the scheduler: our tasks become doit tasks, our store decides staleness.

doit's own dependency file is not used for staleness (a store lookup is), so it is kept
in memory: a build killed at any moment leaves nothing of doit's to repair.
"""

from __future__ import annotations

import sys
import threading
import time

import doit.plugin
from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.task import Task

from magpie.execution.job import Job
from magpie.execution.progress import Progress
from magpie.execution.staleness import closure, reached, stale_reasons
from magpie.graph.expand import changed_inputs

# doit looks up every installed package's plugins (commands, loaders, backends, reporters) on
# each run, four scans of every distribution's metadata (0.12 s a build on the H200's image of
# 200-odd packages); magpie names the one it adds (its backend), and another package's reporter
# or backend has no business in its builds.
doit.plugin.entry_points_impl = lambda: lambda **_: ()


class MemoryDB:
    """doit dependency backend that forgets everything when the build ends."""

    desc = "in-memory (magpie keeps state in its artifact store)"

    def __init__(self, name, codec, *, module_name=None) -> None:
        self.name = name
        self._db: dict = {}

    def dump(self):
        pass

    def set(self, task_id, dependency, value):
        self._db.setdefault(task_id, {})[dependency] = value

    def get(self, task_id, dependency):
        return self._db.get(task_id, {}).get(dependency)

    def in_(self, task_id):
        return task_id in self._db

    def remove(self, task_id):
        self._db.pop(task_id, None)

    def remove_all(self):
        self._db = {}


class BuildReporter:
    """doit's reporter: the build's progress lines, or a rich progress bar (progress.bar)."""

    def __init__(self, *, reasons: dict[str, str], progress: Progress, verdict_of=None):
        self.progress = progress
        self.reasons = reasons
        self.verdict_of = verdict_of  # task name -> what its result says, for its `done` line
        self.failures: list[tuple[str, str]] = []
        self.executed: list[str] = []
        self._started: dict[str, float] = {}
        self.silent = False  # the build is being stopped: it says so in one line of its own
        self._progress = None
        if progress.bar and reasons:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._progress = Bar(
                TextColumn(f"[bold]{progress.title}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=Console(file=progress.stream),
            )
            self._bar = self._progress.add_task("", total=len(reasons))
            self._progress.start()

    def _line(self, text: str) -> None:
        if self.silent:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            self.progress.line(text)

    def warn(self, text: str) -> None:
        """A line said even while the build is being stopped (an artifact found modified)."""
        if self._progress is not None and not self.silent:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            self.progress.line(text)

    def running(self) -> list[str]:
        """The tasks started and not finished, in the order they started."""
        finished = set(self.executed) | {name for name, _ in self.failures}
        return [name for name in list(self._started) if name not in finished]

    def silence(self) -> None:
        self.silent = True
        if self._progress is not None:
            try:
                self._progress.stop()
            except Exception:  # noqa: BLE001 - interrupted while drawing: the line after it still shows
                pass

    def initialize(self, tasks, selected_tasks):
        pass

    def get_status(self, task):
        pass

    def execute_task(self, task):
        self._started[task.name] = time.monotonic()
        if self._progress is not None:
            self._progress.update(self._bar, description=task.name)
        self._line(f"run   {task.name}  ({self.reasons.get(task.name, 'stale')})")

    def add_success(self, task):
        self.executed.append(task.name)
        seconds = time.monotonic() - self._started.get(task.name, time.monotonic())
        if self._progress is not None:
            self._progress.advance(self._bar)
        verdict = self.verdict_of(task.name) if self.verdict_of else ""
        self._line(f"done  {task.name}  {verdict + '  ' if verdict else ''}{seconds:.1f}s")

    def add_failure(self, task, fail):
        self.failures.append((task.name, fail.get_msg().strip().splitlines()[-1] if fail.get_msg() else ""))
        if self._progress is not None:
            self._progress.advance(self._bar)
        self._line(f"FAIL  {task.name}: {self.failures[-1][1]}")

    def skip_uptodate(self, task):
        pass

    def skip_ignore(self, task):
        pass

    def cleanup_error(self, exception):
        self._line(f"cleanup error: {exception}")

    def runtime_error(self, msg):
        self._line(f"error: {msg.strip()}")

    def teardown_task(self, task):
        pass

    def complete_run(self):
        if self._progress is not None:
            self._progress.stop()


class StoreTaskLoader(TaskLoader2):
    def __init__(
        self, project, executor, jobs: int, reporter: BuildReporter, within: set[str] | None = None, secret: str = ""
    ):
        super().__init__()
        self.project = project
        self.executor = executor
        self.jobs = jobs
        self.reporter = reporter
        self.within = within
        self.secret = secret

    def load_doit_config(self):
        return {
            "backend": "magpie-memory",
            "dep_file": str(self.project.store.workspace / ".doit-state"),
            "verbosity": 0,
            "reporter": self.reporter,
            "num_process": self.jobs if self.jobs > 1 else 0,
            "par_type": "thread",
            "continue": True,
        }

    def load_tasks(self, cmd, pos_args):
        return [Task(**fields) for fields in doit_fields(self.project, self.executor, self.within, self.secret)]


def doit_fields(project, executor, within: set[str] | None = None, secret: str = "") -> list[dict]:
    """The project's tasks as doit task fields; staleness is a store lookup by key. `within`: the
    tasks a build may run (its stale ones and what depends on them), the only ones doit is given, each
    waiting for those of its dependencies and order-only `after` tasks among them (the others are up to
    date: a build of one edit in 10,000 artifacts gives doit a handful of tasks); every task without it.
    `secret`: the build's input secret, handed to each job (harness/spec.py)."""

    def among(names: list[str]) -> list[str]:
        return [d for d in names if d in project.tasks and (within is None or d in within)]

    return [
        {
            "name": name,
            "actions": [(run_task, [project, executor, name, secret])],
            "task_dep": among(spec.deps) + among(spec.after),
            "uptodate": [(up_to_date, [project, name])],
            "doc": f"{spec.rule}: {spec.params['description']}".rstrip(": "),
            "io": {"capture": False},  # doit's capture swaps sys.stdout, which races across threads
        }
        for name, spec in project.tasks.items()
        if within is None or name in within
    ]


def up_to_date(project, name: str) -> bool:
    """doit asks once the task's deps are done: its key is then the one of the results they left (the
    one it was loaded with, where none of them ran: nothing is read but one stat)."""
    spec = project.tasks[name]
    key = project.resolve(name) if any(dep in project.rebuilt for dep in spec.deps) else spec.key
    return name not in project.forced and project.store.has(key)


def run_task(project, executor, name: str, secret: str = "") -> bool:
    tasks, store = project.tasks, project.store
    spec = tasks[name]
    if _STOPPING.is_set():
        raise Stopped(f"{name}: not started, the build is being stopped")
    dep_results = {d: read_dependency(project, executor, d, secret) for d in spec.deps}
    project.resolve(name)  # keyed by the results read: one rebuilt by read_dependency has a new digest
    project.rebuilt.add(name)  # its artifact may be another from here on: its dependents' keys too
    job = Job(
        spec,
        dep_results=dep_results,
        dep_dirs={d: str(store.path(tasks[d].key)) for d in spec.deps},
        input_secret=secret,
    )
    output = executor.submit(job).result()
    changed = changed_inputs(project.root, spec.parts, store.file_digests)
    if changed:  # what ran may not be what the key says: an edit during the build is never stored under it
        raise InputsChanged(f"{', '.join(changed)} changed while {name} ran; not stored: run magpie build again")
    with _STORING:
        if _STOPPING.is_set():
            raise Stopped(f"{name}: not stored, the build is being stopped")
        _STORING_IN[0] = threading.get_ident()
        try:
            if name in project.forced:  # the new result replaces the stored one
                store.remove(spec.key)
            store.commit(spec.key, output.result, output.files, task=name)
            store.record(name, spec.key, spec.parts)
        except OSError as err:
            if err.filename is None:  # a write() refused names no file: the artifact it was for
                err.filename = str(store.path(spec.key))
            _stop_unwritable(err)
            raise
        finally:
            _STORING_IN[0] = None
    if _AFTER_STORING and _AFTER_STORING[0][0] == threading.get_ident():  # asked for while this thread stored
        stop_storing(_AFTER_STORING.pop()[1])
    return True


class InputsChanged(RuntimeError):
    """A task's input files changed while it ran."""


class Stopped(RuntimeError):
    """A task that would start, or store its artifact, after the build was told to stop."""


# A build told to stop (by a signal, execution/build.py): from then on no task starts or stores its
# artifact. Storing (commit and index record) is never interrupted by it.
_STOPPING = threading.Event()
# re-entrant: a signal handler may run in the main thread between its taking the lock and its
# saying so in _STORING_IN (or after, while it lets go), and find it held by its own thread
_STORING = threading.RLock()
_STORING_IN: list[int | None] = [None]  # the thread storing an artifact now
_AFTER_STORING: list = []
_REPORTER: list[BuildReporter] = []  # the reporter of the run_doit running now


# A write to the workspace refused (read-only, full disk): no task starts or stores after it,
# and the build ends by raising it, once doit is done (cli/__init__.py says it in one line).
_UNWRITABLE: list[OSError] = []


def _stop_unwritable(err: OSError) -> None:
    from magpie.workspace import unwritable

    if not unwritable(err):
        return
    if not _UNWRITABLE:
        _UNWRITABLE.append(err)
    _STOPPING.set()
    if _REPORTER:
        _REPORTER[0].silence()


def stop_storing(then) -> None:
    """Called in the main thread (from a signal handler): no task starts or stores an artifact
    from now on, and the reporter prints nothing more; then `then(running)` is called with the
    tasks that were running, in the order they started (any of them may have stored its
    artifact just before). A signal handler that interrupted the main thread while it stored
    an artifact defers all of this until that artifact is stored."""
    if _STORING_IN[0] == threading.get_ident():
        _AFTER_STORING.append((threading.get_ident(), then))
        return
    _STOPPING.set()
    with _STORING:  # an artifact being stored by another thread is stored first
        pass
    running = []
    if _REPORTER:
        _REPORTER[0].silence()
        running = _REPORTER[0].running()
    then(running)


def read_dependency(project, executor, name: str, secret: str = "") -> dict:
    """A dependency's result, its files checked against their digests first. One found
    modified since it was written (by anything running while this build runs) is rebuilt
    here, once; modified again, the dependent task fails."""
    from magpie.store import Modified

    key = project.tasks[name].key
    try:
        return project.store.read_verified(key, name)
    except Modified as err:
        found = err
    with _REBUILDING:  # one thread rebuilds it; the others find it rebuilt
        try:
            return project.store.read_verified(key, name)
        except Modified:
            pass
        _warn(str(found))
        project.store.remove(key)
        run_task(project, executor, name, secret)
        try:
            return project.store.read_verified(key, name)
        except Modified as err:
            raise RuntimeError(
                f"store: artifact of {name} was modified again right after it was rebuilt ({err.problem})"
            ) from None


_REBUILDING = threading.Lock()


def _warn(line: str) -> None:
    """A line of the build's (through its reporter), or on stderr where a task runs outside one."""
    if _REPORTER:
        _REPORTER[0].warn(line)
    else:
        print(line, file=sys.stderr, flush=True)


def run_doit(
    project,
    selected: list[str],
    executor,
    jobs: int,
    progress: Progress,
    why: dict[str, str] | None = None,
    secret: str = "",
    covered: list[str] | None = None,
    intact: set[str] | frozenset = frozenset(),
) -> tuple[int, BuildReporter]:
    """`why`: reasons known beforehand (an artifact found modified), over explain()'s.
    `secret`: the build's input secret, handed to each job. `covered`: the selection's closure, its
    provisional tasks forced already (`build.run_provisional_again`), where the caller has it, and
    `intact` those of its tasks whose artifacts were found intact by their stamps (`staleness.runs`)."""
    reasons = stale_reasons(project, selected, why, covered, intact)
    reporter = BuildReporter(reasons=reasons, progress=progress, verdict_of=lambda name: stored_verdict(project, name))
    _REPORTER[:] = [reporter]
    _STOPPING.clear()  # a stopped build ends its process; one stopped in a test does not
    _AFTER_STORING.clear()
    _UNWRITABLE.clear()
    runs = reached(project, covered if covered is not None else closure(project, selected), reasons)
    loader = StoreTaskLoader(project, executor, jobs, reporter, within=set(runs), secret=secret)
    main = DoitMain(
        loader, config_filenames=(), extra_config={"BACKEND": {"magpie-memory": "magpie.execution.doit_glue:MemoryDB"}}
    )
    try:
        code = main.run(["run", *runs])
    finally:
        _REPORTER.clear()  # a task run outside a build (a test's) says its lines on stderr
    if _UNWRITABLE:
        raise _UNWRITABLE[0]
    return code, reporter


def stored_verdict(project, name: str) -> str:
    """What the stored result of a task says (report/verdicts.py), "" where it says nothing
    or cannot be read (the line is the reporter's, never a reason for the build to fail)."""
    from magpie.report.verdicts import task_line

    spec = project.tasks[name]
    try:
        return task_line(spec.rule, project.store.read(spec.key))
    except (OSError, ValueError, KeyError, TypeError):
        return ""
