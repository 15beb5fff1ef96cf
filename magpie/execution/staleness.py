"""What a build of some tasks covers and which of them it runs, and why: `--dry-run`'s answer, which
imports no doit (execution/doit_glue.py, which schedules them, re-exports both)."""

from __future__ import annotations

from magpie.graph.expand import explain


def stale_reasons(
    project,
    selected: list[str],
    why: dict[str, str] | None = None,
    covered: list[str] | None = None,
    intact: set[str] | frozenset = frozenset(),
) -> dict[str, str]:
    """{task: why it runs} for the tasks a build of `selected` runs, in run order. `why`: reasons
    known beforehand (an artifact found modified), over explain()'s; `covered`: the selection's
    closure, its provisional tasks forced already (`build.run_provisional_again`), where the caller has it;
    `intact`: those of its tasks whose artifacts `build.check_artifacts` found intact by their stamps."""
    why = why or {}
    if covered is None:
        stale = project.stale(closure(project, selected))
    else:
        stale = runs(project, covered, intact)
    running = set(stale)
    return {
        name: why.get(name)
        or explain(
            project.tasks[name].parts,
            project.store.recorded(name),
            first=running.intersection(project.tasks[name].deps),
            forced=name in project.forced,
        )
        for name in stale
    }


def closure(project, selected: list[str]) -> list[str]:
    """The selected tasks and everything they depend on, in run order: one pass back over the tasks
    (a task's deps come before it), none where all of them are selected (a build of the whole project)."""
    tasks = project.tasks
    wanted = set(selected)
    if len(wanted) == len(tasks) and all(name in tasks for name in wanted):
        return list(tasks)
    for name in reversed(tasks):
        if name in wanted:
            wanted.update(tasks[name].deps)
    return [name for name in tasks if name in wanted]


def runs(project, covered: list[str], intact: set[str] | frozenset = frozenset()) -> list[str]:
    """`Project.stale(covered, provisional_forced=True)`, for a closure `covered` whose provisional tasks
    are forced already, where the tasks `intact` by their stamps (`build.check_artifacts`: their artifacts'
    files have the stat they had when found right) are known to have their artifacts: the store is asked
    only about the others (one `stat` fewer per intact task: 10,000 in a dry run after one edit)."""
    tasks, store, forced = project.tasks, project.store, project.forced
    wanted = set(covered)
    found: set[str] = set()
    for name, spec in tasks.items():
        if name not in wanted:
            continue
        if name in forced or (name not in intact and not store.has(spec.key)):
            found.add(name)
        elif found and not found.isdisjoint(spec.deps):
            # a gate that runs changes this task's key only if its verdict changes (`resolve_key`)
            gates = spec.params.get("gates") or ()
            if any(dep in found for dep in spec.deps if dep not in gates):
                found.add(name)
    return [name for name in tasks if name in found]


def maybe_provisional(project, names: list[str], intact: set[str]) -> list[str]:
    """The tasks among `names` whose artifact may hold a provisional result (`Store.provisional`): all but
    those `intact` by their stamp (their files' stat unchanged since their digests were found right,
    `build.check_artifacts`) whose stamp lists no provisional marker. A stamp lists every file of the
    artifact (`Store.scan`, `Store.commit`), the marker among them, which is signed with the rest: a marker
    put in later is no file of the artifact's. One `open` fewer per intact task (10,000 in a no-op's
    dry run)."""
    from magpie.store import PROVISIONAL

    stamps, tasks = project.store.stamps, project.tasks
    return [
        name
        for name in names
        if name not in intact or any(entry[0] == PROVISIONAL for entry in stamps.get(tasks[name].key) or ())
    ]


def reached(project, covered: list[str], start) -> list[str]:
    """`start` and the tasks among `covered` that depend on one of them, directly or not, in run order:
    what a build may run. A task gated by one that runs (`Rule.gates`) is not stale beforehand, but runs
    where that one's verdict changes."""
    found, covered_set = set(start), set(covered)
    for name, spec in project.tasks.items():
        if name not in found and name in covered_set and any(dep in found for dep in spec.deps):
            found.add(name)
    return [name for name in project.tasks if name in found]
