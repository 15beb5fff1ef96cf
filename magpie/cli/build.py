"""magpie build: bring every stale artifact of the project up to date."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sys
import threading
from pathlib import Path

from magpie.errors import UserError
from magpie.report.publish import PUBLISHED, publish, publish_project


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="build stale artifacts (compile, correctness, timing, comparison, report)",
                       description="Build the artifacts of magpie.toml that are out of date. Editing one "
                                   "candidate re-runs only its tasks and the comparison and report above them.")
    p.add_argument("targets", nargs="*", help="kernel ids or task names (default: everything)")
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="independent tasks run in parallel (default: 1)")
    p.add_argument("--executor", choices=("inline", "local"), help="where jobs run (default: inline for -j 1, "
                                                                    "a local process pool otherwise)")
    p.add_argument("-n", "--dry-run", action="store_true", help="list what would run and why, run nothing")
    p.add_argument("--force", action="store_true",
                   help="run the targets (task names or kernel ids) again even where up to date; what depends on "
                        "their results follows")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end: per implementation its verdict, failure kinds "
                        "and speedup, the report paths, the check (the same schema for a no-op)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when an implementation failed (compile, correctness, timing), timed out, was "
                        "inconclusive or not judged (a spec error), when one declared expect_faster is not faster, "
                        "or when a task failed (for CI; a no-op build checks the stored verdicts)")
    p.add_argument("--trust-code", action="store_true",
                   help="run code under test without a sandbox where the host allows none (only code you trust)")
    p.add_argument("--verify", action="store_true",
                   help="hash every artifact first and rebuild any modified since it was written (otherwise one "
                        "whose files' stat is unchanged since its digest was last checked is trusted unread)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.jobs < 1:
        raise UserError("--jobs: must be at least 1")
    if args.force and not args.targets:
        raise UserError("--force: name what to run again (task names such as timing:KERNEL/IMPL, or kernel ids)")
    if args.trust_code:
        from magpie import sandbox

        sandbox.admit(True)
    if not args.targets and not args.dry_run and not args.verify:
        code = _up_to_date_by_snapshot(Path(args.manifest), args.json, args.check)
        if code is not None:
            return code
    if not args.dry_run:
        from magpie.execution import pool

        pool.prestart(args.jobs, args.executor)  # its imports beside the project's loading
    from magpie.graph import snapshot
    from magpie.project import Project

    project = Project.load(args.manifest)
    saved = snapshot.save(project)
    selected = project.select(args.targets)
    if args.force:
        project.forced.update(selected)
        selected = project.with_dependents(selected)
    if args.dry_run:
        return dry_run(project, selected, args.json)
    refuse_on_read_only(project, selected)
    try:
        with stopped_by_sigterm(project):
            return build(project, selected, jobs=args.jobs, executor_name=args.executor,
                         use_rich=sys.stderr.isatty() and not args.plain, as_json=args.json, verify=args.verify,
                         check=args.check)
    finally:
        snapshot.save(project, saved)  # with the stamps of the artifacts checked or written


def refuse_on_read_only(project, selected: list[str]) -> None:
    """A build with something to store, on a workspace it cannot write, ends before it starts."""
    from magpie import workspace

    if workspace.writable(project.store.workspace):
        return
    stale = project.stale(selected)
    if stale:
        raise UserError(workspace.read_only_line(
            project.store.workspace, f"{len(stale)} stale tasks would store their artifacts there (first: {stale[0]})"))


@contextlib.contextmanager
def stopped_by_sigterm(project):
    """While the block runs, SIGTERM stops the build: no task starts or stores its artifact
    after it (one being stored is stored first), every process the build started is killed
    (a zygote kept warm for later builds excepted), one line on stderr names the tasks that
    were running, and the process exits 143 (SystemExit, raised where the main thread was)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, _: _stop(project, signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(project, signum: int) -> None:
    from magpie.execution.doit_glue import stop_storing

    if not _STOPPING:  # a second signal while stopping changes nothing
        _STOPPING.append(signum)
        stop_storing(lambda running: _stopped(project, signum, running))


_STOPPING: list[int] = []


def _stopped(project, signum: int, running: list[str]) -> None:
    import multiprocessing.resource_tracker as resource_tracker

    from magpie.execution.executors import stop_descendants
    from magpie import environment
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
    unstored = [task for task in running if not project.store.has(project.tasks[task].key)]
    line = (f"magpie: stopped by {name} while running {', '.join(unstored)}; nothing of them was stored"
            if unstored else f"magpie: stopped by {name}; no task was running")
    # a write of its own: the main thread may have been stopped inside one of sys.stderr's
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())
    raise SystemExit(128 + signum)


def dry_run(project, selected: list[str], as_json: bool) -> int:
    from magpie.execution.doit_glue import closure, stale_reasons
    from magpie.store import reason

    covered = closure(project, selected)
    modified = {name: reason(problem) for name, problem in
                check_artifacts(project, covered, remove=False).items()}
    project.forced.update(modified)  # a build removes and rebuilds them: so do their dependents
    again = run_provisional_again(project, covered)
    rows = list(stale_reasons(project, selected, {**again, **modified}).items())  # in run order
    if as_json:
        print(json.dumps({"would_run": [{"task": n, "why": w} for n, w in rows],
                          "up_to_date": len(project.tasks) - len(rows)}, indent=1))
    else:
        for name, why in rows:
            print(f"would run  {name}  ({why})")
        print(f"{len(rows)} to run, {len(project.tasks) - len(rows)} up to date")
    return 0


# Actions that start an evaluator: the build starts their zygote (importing torch) at once.
EVALUATING_ACTIONS = ("magpie:correctness", "magpie:timing")


def build(project, selected: list[str], *, jobs: int = 1, executor_name: str | None = None,
          use_rich: bool = False, as_json: bool = False, quiet: bool = False, title: str = "magpie build",
          verify: bool = False, check: bool = False) -> int:
    from magpie.execution.executors import make_executor
    from magpie.execution.doit_glue import closure, run_doit
    from magpie.store import reason
    from magpie.supervision import zygote

    project.store.sweep_temporaries()
    # what this build reads or publishes, checked first: a modified artifact is rebuilt
    published = [name for name, spec in project.tasks.items() if spec.rule in PUBLISHED]
    modified = check_artifacts(project, list(dict.fromkeys(closure(project, selected) + published)),
                               trust_stamps=not verify)
    selected = selected + [name for name in modified if name not in selected]
    again = run_provisional_again(project, closure(project, selected))
    stale = project.stale(selected)
    if not stale:
        bad = publish_project(project)
        if not bad:
            if not (as_json or check):
                if not quiet:
                    print(f"magpie: {len(selected)} artifacts up to date")
                return 0
            return _finish(_summary(project, selected, [], []), as_json, check, quiet,
                           f"magpie: {len(selected)} artifacts up to date")
        selected += [name for name in bad if name not in selected]  # modified since checked
        stale = project.stale(selected)
    evaluates = any(project.tasks[name].action in EVALUATING_ACTIONS for name in stale)
    if evaluates or any(not project.tasks[name].action.startswith("magpie:") for name in stale):
        from magpie import sandbox

        sandbox.admit(project.manifest.project.trust_code)  # code under test runs: in a sandbox, or trusted
    why = {**again, **{name: reason(problem) for name, problem in modified.items()}}
    # before the executor, so that its job processes find the zygote's folder
    with input_secret(evaluates), zygote.session(prestart=evaluates):
        executor = make_executor(jobs, executor_name)
        try:
            code, reporter = run_doit(project, selected, executor, jobs, use_rich, title, why)
            again = publish_project(project)  # modified while this build ran: rebuilt once more
            if again:
                more, second = run_doit(project, again, executor, jobs, use_rich, title)
                reporter.executed += second.executed
                reporter.failures += second.failures
                code = code or more or (1 if publish_project(project) else 0)
        finally:
            executor.shutdown()
    from magpie.report.verdicts import relative

    line = (f"magpie: ran {len(reporter.executed)} tasks, {len(reporter.failures)} failed; "
            f"reports in {relative(project.store.workspace / 'reports', project.root)}")
    if not (as_json or check):
        if not quiet:
            print(line)
        return 0 if code == 0 else 1
    checked = _finish(_summary(project, selected, reporter.executed, reporter.failures), as_json, check, quiet, line)
    return 0 if code == 0 and checked == 0 else 1


def run_provisional_again(project, closure: list[str]) -> dict[str, str]:
    """{task: why} for the tasks of `closure` whose stored results are not final (an
    inconclusive timing), marked forced: a build runs them again and replaces them."""
    again = project.provisional(closure)
    project.forced.update(again)
    return again


@contextlib.contextmanager
def input_secret(needed: bool):
    """While the block runs, a secret of this build's own in the environment its jobs inherit,
    mixed into every input seed (harness/spec.py); one the caller set is used as it is. Taken
    out afterwards: a process that builds again (a library caller, a server, a test) would
    otherwise hand every later build the same secret, and their inputs would repeat."""
    from magpie.harness.spec import SECRET_VARIABLE

    if not needed or SECRET_VARIABLE in os.environ:
        yield
        return
    os.environ[SECRET_VARIABLE] = secrets.token_hex(16)
    try:
        yield
    finally:
        os.environ.pop(SECRET_VARIABLE, None)


def _summary(project, selected: list[str], executed: list[str], failed: list[tuple[str, str]]) -> dict:
    """The summary of a build of `selected` (report/verdicts.py), from the stored artifacts."""
    from magpie.execution.doit_glue import closure
    from magpie.report.verdicts import build_summary

    names = closure(project, selected)
    covered = [(name, project.tasks[name].rule, project.tasks[name].kernel, project.tasks[name].key)
               for name in names]
    done = set(executed) | {name for name, _ in failed}
    up_to_date = sum(1 for name, _, _, key in covered if name not in done and project.store.has(key))
    expected = {(kernel.id, impl.id) for kernel in project.manifest.kernel for impl in kernel.implementations()
                if impl.expect_faster}
    return build_summary(project.root, project.store, covered, expected, executed=executed, failed=failed,
                         up_to_date=up_to_date, uncompared=_uncompared(project, names))


def _uncompared(project, closure: list[str]) -> list[dict]:
    """The comparisons of the kernels whose implementations' tasks `closure` covers but not their
    comparison (`magpie build timing:k/x`), made of the stored results as the comparison would."""
    from magpie.execution.actions import compare_results

    compared = {project.tasks[name].kernel for name in closure if project.tasks[name].rule == "comparison"}
    results: dict[str, dict[str, dict]] = {}
    for name in closure:
        spec = project.tasks[name]
        if spec.kernel not in compared and spec.impl and spec.rule in ("compile", "correctness", "timing", "profile") \
                and project.store.has(spec.key):
            results.setdefault(spec.kernel, {})[name] = project.store.read(spec.key)
    baselines = {project.tasks[name].kernel: project.tasks[name].params["baseline"] for name in closure}
    return [compare_results(kernel, found, baselines[kernel]) for kernel, found in sorted(results.items())]


def _finish(summary: dict, as_json: bool, check: bool, quiet: bool, line: str) -> int:
    """Print the build's summary (JSON, checked against its model, or `line` and, with
    --check, each problem); 1 where --check fails, else 0."""
    if as_json:
        from magpie.report.models import BuildSummary

        print(BuildSummary.model_validate(summary).model_dump_json(indent=1))
    elif not quiet:
        print(line)
        if check:
            for problem in summary["check"]["problems"]:
                print(f"check: {problem}")
            print("magpie: check passed" if summary["check"]["passed"] else
                  f"magpie: check failed: {len(summary['check']['problems'])} problem(s)")
    return 1 if check and not summary["check"]["passed"] else 0


def check_artifacts(project, names: list[str], *, trust_stamps: bool = True, remove: bool = True) -> dict[str, str]:
    """{task: problem} for the built artifacts among `names` whose files are not the ones
    recorded when they were written; each is announced in one line and removed (so that
    the build rebuilds it) unless `remove` is false. An artifact whose files' stat is the one
    they had when its digest was last found right is not read again (unless not trust_stamps)."""
    from magpie.store import warning

    store, found = project.store, {}
    for name in names:
        key = project.tasks[name].key
        if not store.has(key):
            continue
        problem = store.check(key, name, trust_stamps=trust_stamps)
        if problem is not None:
            found[name] = problem
            if remove:
                print(warning(name, problem), file=sys.stderr, flush=True)
                store.remove(key)
    return found


def _up_to_date_by_snapshot(manifest: Path, as_json: bool, check: bool = False) -> int | None:
    """The fast no-op: keys from the snapshot, one stat per artifact file, no manifest validation.
    Its exit code, or None where the build is not a no-op by the snapshot. With --json or
    --check the verdicts are read from the stored comparisons."""
    from magpie.graph import snapshot
    from magpie.store import Store

    saved = snapshot.load_fresh(manifest)
    if saved is None:
        return None
    store = Store(Path(saved["workspace"]))
    tasks = saved["tasks"]
    if not all(store.unchanged(t["key"], t.get("stamp")) for t in tasks.values()):
        return None  # missing, or touched since its digest was checked: the full load checks it
    if any(t.get("provisional") for t in tasks.values()):
        return None  # a result not final (inconclusive): the full load runs it again
    covered = [(name, t["rule"], t["kernel"], t["key"]) for name, t in tasks.items()]
    if publish(store, covered):
        return None  # one was modified (and is removed now): the full load rebuilds it
    line = f"magpie: {len(tasks)} artifacts up to date"
    if not (as_json or check):
        print(line)
        return 0
    import tomllib

    from magpie.report.verdicts import build_summary, expected_faster_in

    expected = expected_faster_in(tomllib.loads(manifest.read_text()))
    summary = build_summary(manifest.resolve().parent, store, covered, expected, executed=[], failed=[],
                            up_to_date=len(tasks))
    return _finish(summary, as_json, check, False, line)
