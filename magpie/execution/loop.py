"""`magpie loop`: where a project's optimization loop stands for one [[benchmark]] (baseline benchmarked, top
bottlenecks found, kernels declared for them, candidates judged, the winner validated end to end by the A/B),
which of its steps are stale, and the one next step as a command. Read from the store and the build's own
staleness (`staleness.stale_reasons`, what `magpie build --dry-run` answers): nothing is run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from magpie.errors import UserError, located
from magpie.graph.expand import known

State = Literal["done", "stale", "missing", "not declared"]
STAGES = ("baseline", "bottlenecks", "kernels", "candidates", "e2e")


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str  # one of STAGES
    state: State
    tasks: list[str]  # the build's tasks that make this stage's evidence
    detail: str  # what the evidence says, or what is missing


class NextStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    command: str  # a command to run, or the edit to make
    why: str


class LoopStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str
    benchmark: str
    stages: list[Stage]
    stale: dict[str, str]  # task -> why a build would run it (as `magpie build --dry-run` says)
    next_step: NextStep


def loop_status(project, benchmark: str | None = None) -> LoopStatus:
    """The loop's status for `benchmark` (default: the manifest's first [[benchmark]])."""
    manifest = project.manifest
    if not manifest.benchmark:
        raise located(
            project.manifest_path,
            "benchmark",
            "no [[benchmark]]: the loop starts from a workload; declare one (id, engine, model) to benchmark",
        )
    ids = [b.id for b in manifest.benchmark]
    if benchmark is None:
        benchmark = ids[0]
    if benchmark not in ids:
        raise UserError(f"{project.manifest_path}: no [[benchmark]] {benchmark!r} (benchmarks: {', '.join(ids)})")
    bench = next(b for b in manifest.benchmark if b.id == benchmark)
    kernels = {k.id: k for k in manifest.kernel}
    used = [k for k in bench.use if k in kernels]

    names = [
        f"benchmark:{benchmark}",
        f"benchmark_profile:{benchmark}",
        f"benchmark_trace_analysis:{benchmark}",
        *(f"comparison:{k}" for k in used),
        f"benchmark_ab:{benchmark}",
    ]
    present = [n for n in names if n in project.tasks]
    stale = _dry_run(project, present) if present else {}

    def state(name: str) -> State:
        if name not in project.tasks:
            return "not declared"
        if name not in stale:
            return "done"
        return "stale" if project.store.recorded(name) else "missing"

    def result(name: str) -> dict:
        """The task's result under its current key, else its last one still stored (the evidence of a stale
        stage, shown as such); {} where there is none."""
        if name not in project.tasks:
            return {}
        last = (project.store.recorded(name) or {}).get("key")
        for key in (project.tasks[name].key, last):
            if key and known(key) and project.store.has(key):
                try:
                    return project.store.read(key)
                except (OSError, ValueError):
                    return {}
        return {}

    stages: list[Stage] = []
    steps: list[NextStep] = []

    def build_step(stage: str, name: str, why: str) -> None:
        steps.append(NextStep(stage=stage, command=f"magpie build {name}", why=why))

    # baseline
    name = f"benchmark:{benchmark}"
    summary = result(name).get("summary") or {}
    throughput, latency = summary.get("throughput") or {}, summary.get("latency") or {}
    shown = {
        "output tok/s": throughput.get("output_tokens"),
        "requests/s": throughput.get("request"),
        "TTFT median ms": (latency.get("ttft") or {}).get("median"),
    }
    detail = ", ".join(f"{k} {v:.4g}" for k, v in shown.items() if isinstance(v, (int, float))) or (
        "benchmarked" if summary else ""
    )
    stages.append(Stage(name="baseline", state=state(name), tasks=[name], detail=detail or stale.get(name, "")))
    if state(name) != "done":
        build_step("baseline", name, f"the workload's baseline is {state(name)}: benchmark it")

    # bottlenecks
    analysis, profiled = f"benchmark_trace_analysis:{benchmark}", f"benchmark_profile:{benchmark}"
    top = result(analysis).get("top_bottlenecks") or []
    # with kernels used already the profile is optional (the A/B's Amdahl prediction is what it adds)
    if analysis not in project.tasks:
        stages.append(Stage(name="bottlenecks", state="not declared", tasks=[], detail="no profiled run"))
        if not used:
            steps.append(
                NextStep(
                    stage="bottlenecks",
                    command=f"add profiler = true to [[benchmark]] {benchmark} in magpie.toml, "
                    f"then magpie build {analysis}",
                    why="the top bottlenecks come from a profiled run's trace analysis",
                )
            )
    else:
        rows = [f"{r.get('CPU Op') or r.get('Name')} {r.get('% Total')}%" for r in top[:3]]
        detail = "top ops by share: " + "; ".join(rows) if rows else stale.get(analysis, "no top ops")
        stages.append(Stage(name="bottlenecks", state=state(analysis), tasks=[profiled, analysis], detail=detail))
        if state(analysis) != "done" and not used:
            build_step("bottlenecks", analysis, f"the trace analysis is {state(analysis)}")

    # kernels
    if used:
        sources = [
            f"{k} replaces {kernels[k].replaces} ({len(kernels[k].candidates)} candidate(s))"
            if kernels[k].replaces
            else f"{k} ({len(kernels[k].candidates)} candidate(s))"
            for k in used
        ]
        stages.append(Stage(name="kernels", state="done", tasks=[], detail="; ".join(sources)))
    else:
        op = next((r.get("CPU Op") for r in top if r.get("CPU Op")), None)
        stages.append(Stage(name="kernels", state="missing", tasks=[], detail="the benchmark uses no [[kernel]]"))
        steps.append(
            NextStep(
                stage="kernels",
                command=f"magpie kernel from-trace {_trace_file(project, profiled)} --op {op or 'OP'}",
                why="declare a [[kernel]] for a top op (replaces = its Python path) and name it in the benchmark's use",
            )
        )

    # candidates
    comparisons = [f"comparison:{k}" for k in used]
    verdicts = []
    for k in used:
        name = f"comparison:{k}"
        if not kernels[k].candidates:
            folder = Path(kernels[k].baseline.source).parent if kernels[k].baseline else Path(k)
            steps.append(
                NextStep(
                    stage="candidates",
                    command=f"write a candidate at {folder / 'candidate.py'} and list it in [[kernel]] {k}'s candidates",
                    why=f"kernel {k} has no candidate to judge",
                )
            )
            verdicts.append(f"{k}: no candidate")
            continue
        if state(name) != "done":
            build_step("candidates", name, f"kernel {k}'s comparison is {state(name)}: {stale.get(name)}")
        judged = result(name)
        if not judged:
            verdicts.append(f"{k}: {state(name)}")
            continue
        best = judged.get("best")
        verdicts.append(f"{k}: winner {best}" if best else f"{k}: no winner (no correct candidate faster beyond noise)")
        if not best and bench.use[k] == "best":
            steps.append(
                NextStep(
                    stage="candidates",
                    command=f"write a better candidate for [[kernel]] {k}, then magpie build {name}",
                    why="no candidate is correct and faster than the baseline",
                )
            )
    if used:
        states = {state(n) for n in comparisons}
        overall: State = "done" if states == {"done"} else "stale" if "stale" in states else "missing"
        stages.append(Stage(name="candidates", state=overall, tasks=comparisons, detail="; ".join(verdicts)))
    else:
        stages.append(Stage(name="candidates", state="missing", tasks=[], detail="no kernel used"))

    # end to end
    name = f"benchmark_ab:{benchmark}"
    ab = result(name)
    if name in project.tasks:
        detail = stale.get(name, "") if not ab else _ab_detail(ab)
        stages.append(Stage(name="e2e", state=state(name), tasks=[name], detail=detail))
        if state(name) != "done":
            build_step("e2e", name, "the A/B of the benchmark with the kernel put in")
    else:
        stages.append(Stage(name="e2e", state="not declared", tasks=[], detail="no A/B (the benchmark uses no kernel)"))

    next_step = (
        steps[0] if steps else NextStep(stage="done", command="nothing: every step is current", why=stages[-1].detail)
    )
    return LoopStatus(
        project=manifest.project.name, benchmark=benchmark, stages=stages, stale=stale, next_step=next_step
    )


def _dry_run(project, names: list[str]) -> dict[str, str]:
    """{task: why} a build of `names` runs: `magpie build --dry-run`'s own answer (`build.plan`, after the same
    stamps of the artifacts a build trusts by their stat), provisional results and modified artifacts included."""
    from magpie.execution.build import plan
    from magpie.graph import snapshot

    snapshot.take_stamps(project)
    return dict(plan(project, names).would_run)


def _ab_detail(ab: dict) -> str:
    gate = ab.get("gate") or {}
    changes = []
    for metric, m in (ab.get("metrics") or {}).items():
        if m.get("ratio") is not None:
            low, high = (
                f"{v:.3g}" if isinstance(v, (int, float)) else "?" for v in (m.get("ci_low"), m.get("ci_high"))
            )
            changes.append(f"{metric} x{m['ratio']:.3g} [{low}, {high}] {m.get('verdict')}")
    gate_text = f"gate {'passed' if gate.get('passed') else 'refused'} {gate.get('matched')}/{gate.get('prompts')}"
    return f"{ab.get('claim')}; {gate_text}; " + "; ".join(changes[:3])


def _trace_file(project, profiled: str) -> str:
    """A trace of the profiled run's artifact, where it is built; else the placeholder TRACE."""
    from magpie.serving.profiling import TRACE_DIR

    spec = project.tasks.get(profiled)
    if spec is None or not project.store.has(spec.key):
        return "TRACE"
    folder = project.store.path(spec.key) / TRACE_DIR
    found = sorted(p for p in folder.rglob("*") if p.name.endswith((".json", ".json.gz"))) if folder.is_dir() else []
    if not found:
        return "TRACE"
    return str(found[0].relative_to(project.root) if found[0].is_relative_to(project.root) else found[0])


def render(status: LoopStatus) -> str:
    """The status as a text table, then the next step."""
    width = max(len(s.name) for s in status.stages)
    lines = [f"loop of {status.project}, benchmark {status.benchmark}", ""]
    lines += [f"{s.name:<{width}}  {s.state:<12}  {s.detail}" for s in status.stages]
    if status.stale:
        lines += ["", "stale (a build runs):"] + [f"  {t}: {why}" for t, why in status.stale.items()]
    lines += ["", f"next: {status.next_step.command}", f"      ({status.next_step.why})"]
    return "\n".join(lines)
