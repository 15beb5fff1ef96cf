"""magpie build: bring every stale artifact of the project up to date."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from magpie.errors import UserError


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
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout at the end")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.jobs < 1:
        raise UserError("--jobs: must be at least 1")
    if not args.targets and not args.dry_run and _up_to_date_by_snapshot(Path(args.manifest), args.json):
        return 0
    from magpie.graph import snapshot
    from magpie.project import Project

    project = Project.load(args.manifest)
    snapshot.save(project)
    selected = project.select(args.targets)
    if args.dry_run:
        return dry_run(project, selected, args.json)
    return build(project, selected, jobs=args.jobs, executor_name=args.executor,
                 use_rich=sys.stderr.isatty() and not args.plain, as_json=args.json)


def dry_run(project, selected: list[str], as_json: bool) -> int:
    from magpie.graph.doit_glue import _closure
    from magpie.graph.expand import explain

    stale = project.stale(_closure(project, selected))
    rows = [(name, explain(project.tasks[name].parts, project.store.recorded(name))) for name in stale]
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
          use_rich: bool = False, as_json: bool = False, quiet: bool = False, title: str = "magpie build") -> int:
    from magpie.execution.executors import make_executor
    from magpie.graph.doit_glue import run_doit
    from magpie.harness import zygote

    project.store.sweep_temporaries()
    stale = project.stale(selected)
    if not stale:
        publish_project(project)
        if as_json:
            print(json.dumps({"executed": [], "failed": [], "up_to_date": len(selected)}))
        elif not quiet:
            print(f"magpie: {len(selected)} artifacts up to date")
        return 0
    evaluates = any(project.tasks[name].action in EVALUATING_ACTIONS for name in stale)
    # before the executor, so that its job processes find the zygote's folder
    with zygote.session(prestart=evaluates):
        executor = make_executor(jobs, executor_name)
        try:
            code, reporter = run_doit(project, selected, executor, jobs, use_rich, title)
        finally:
            executor.shutdown()
    publish_project(project)
    if as_json:
        print(json.dumps({"executed": reporter.executed, "failed": [f for f, _ in reporter.failures]}))
    elif not quiet:
        print(f"magpie: ran {len(reporter.executed)} tasks, {len(reporter.failures)} failed; "
              f"reports in {project.store.workspace / 'reports'}")
    return 0 if code == 0 else 1


def _up_to_date_by_snapshot(manifest: Path, as_json: bool) -> bool:
    """The fast no-op: keys from the snapshot, one stat per artifact, no manifest validation."""
    from magpie.graph import snapshot
    from magpie.store import Store

    saved = snapshot.load_fresh(manifest)
    if saved is None:
        return False
    store = Store(Path(saved["workspace"]))
    tasks = saved["tasks"]
    if not all(store.has(t["key"]) for t in tasks.values()):
        return False
    publish(store, [(name, t["rule"], t["kernel"], t["key"]) for name, t in tasks.items()])
    if as_json:
        print(json.dumps({"executed": [], "failed": [], "up_to_date": len(tasks)}))
    else:
        print(f"magpie: {len(tasks)} artifacts up to date")
    return True


def publish_project(project) -> None:
    publish(project.store, [(name, spec.rule, spec.kernel, spec.key) for name, spec in project.tasks.items()])


def publish(store, artifacts: list[tuple[str, str, str | None, str]]) -> None:
    """Copy the current comparison, trace analysis and report artifacts to stable paths under reports/."""
    out = store.workspace / "reports"
    for name, rule, kernel, key in artifacts:
        if rule not in ("comparison", "report", "trace_analysis") or not store.has(key):
            continue
        folder = store.path(key)
        if rule == "comparison":
            target = out / kernel / "compare_report.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / "result.json", target)
        elif rule == "trace_analysis":
            target = out / "traces" / name.split(":", 1)[1]
            stamp = target / ".artifact"
            if stamp.is_file() and stamp.read_text() == key:
                continue  # published already: keeps the no-op build a stat per artifact
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(folder, target)
            stamp.write_text(key)
        else:
            out.mkdir(parents=True, exist_ok=True)
            for produced in ("report.html", "summary.md"):
                if (folder / produced).is_file():
                    shutil.copyfile(folder / produced, out / produced)
