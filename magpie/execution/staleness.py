"""What a build of some tasks covers and which of them it runs, and why: `--dry-run`'s answer, which
imports no doit (execution/doit_glue.py, which schedules them, re-exports both)."""

from __future__ import annotations

from magpie.graph.expand import explain


def stale_reasons(
    project, selected: list[str], why: dict[str, str] | None = None, covered: list[str] | None = None
) -> dict[str, str]:
    """{task: why it runs} for the tasks a build of `selected` runs, in run order. `why`: reasons
    known beforehand (an artifact found modified), over explain()'s; `covered`: the selection's
    closure, its provisional tasks forced already (`build.run_provisional_again`), where the caller has it."""
    why = why or {}
    if covered is None:
        stale = project.stale(closure(project, selected))
    else:
        stale = project.stale(covered, provisional_forced=True)
    runs = set(stale)
    return {
        name: why.get(name)
        or explain(
            project.tasks[name].parts,
            project.store.recorded(name),
            first=runs.intersection(project.tasks[name].deps),
            forced=name in project.forced,
        )
        for name in stale
    }


def closure(project, selected: list[str]) -> list[str]:
    """The selected tasks and everything they depend on (each task and edge looked at once)."""
    seen: dict[str, None] = {}
    stack = list(selected)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen[name] = None
        stack.extend(dep for dep in project.tasks[name].deps if dep not in seen)
    return list(seen)


def reached(project, covered: list[str], start) -> list[str]:
    """`start` and the tasks among `covered` that depend on one of them, directly or not, in run order:
    what a build may run. A task gated by one that runs (`Rule.gates`) is not stale beforehand, but runs
    where that one's verdict changes."""
    found, covered_set = set(start), set(covered)
    for name, spec in project.tasks.items():
        if name not in found and name in covered_set and any(dep in found for dep in spec.deps):
            found.add(name)
    return [name for name in project.tasks if name in found]
