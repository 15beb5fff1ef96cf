"""The reports magpie writes, as pydantic models: the contract behind their JSON keys.

Reports are built as plain dicts by the actions (they cross process boundaries as JSON) and
checked against these models before they are written, so a key that goes missing or changes
type fails the build that wrote it instead of the scripts that read it. The keys follow
Magpie's (`compiling_state`, `correctness_state`, `performance_state`, `performance_result`,
`errors`) and TraceLens's where they exist; beside `verdict` and `errors`, `failures` says the same
in records a script can match on (kind, stage, case). Nested details the models do not name (timer
info, kernel lists, per-round data) are allowed through unchecked.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from magpie.harness.clocks import ClockRegime
from magpie.harness.kinds import KINDS, STAGES

# INCONCLUSIVE: a timing a busy machine disturbed beyond correction (no verdict; measured again next build)
State = Literal["SUCCESS", "FAILED", "SKIPPED", "INCONCLUSIVE"]
# verified: compared with a Python reference; checked by the testcase command: only commands judged
# it (their exit codes); unverified: it ran on its own inputs, only finiteness checked
Numerics = Literal["verified", "checked by the testcase command", "unverified"]


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class PerformanceResult(Open):
    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    mean_us: float
    n: int
    cv: float
    method: str
    shape: str | None = None
    kernel_us: float | None = None
    dispatch_overhead_us: float | None = None
    flags: list[str] = []
    clocks: ClockRegime | None = None  # the GPU's clocks over the measurement, or why none were read


class ProfilerTime(Open):
    """A command-only kernel's kernels as the profiler measured them (ncu gpu__time_duration),
    labelled by `method`: not a timed measurement, never ranked."""

    method: str
    kernel_us: float
    launches: int
    kernels: list[str]


class Failure(Open):
    """One failure, where it was detected: `kind` is one of harness/kinds.py's KINDS, `detail`
    the line a person reads; the case where it is known (a worker that died took its whole
    testcase with it: only `testcase` then), and the error magnitudes a check computed."""

    # kinds.py's tuples are the one list of kinds and stages; pydantic reads Literal[tuple] as
    # Literal of its items at runtime, which a static checker cannot follow
    kind: Literal[KINDS]  # type: ignore[valid-type]
    stage: Literal[STAGES]  # type: ignore[valid-type]
    detail: str
    check: str | None = None
    testcase: int | None = None
    case: str | None = None
    shape: list | None = None
    dtype: str | None = None
    trial: int | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None


class NumericsMargin(Open):
    """How close a correct implementation came: the figures of the case that used most of its
    tolerance (`tolerance_used`: max |got - expected| / (atol + rtol |expected|), 1 at the bound)."""

    max_abs_err: float
    max_rel_err: float
    rel_err_norm: float
    tolerance_used: float | None = None
    case: str | None = None
    trial: int | None = None
    cases: int


class Speedup(Open):
    value: float
    ci_low: float
    ci_high: float
    verdict: Literal["faster", "slower", "within noise", "baseline"]


class TimedShape(Open):
    """One timed shape of an implementation's timing (`timing.shapes`): its own verdict, timing
    and speedup (with the baseline median it was computed from)."""

    shape: str
    performance_state: State | None
    performance_result: PerformanceResult | None
    baseline_result: PerformanceResult | None
    speedup: Speedup | None
    errors: list[str] = []


class ShapesSummary(Open):
    """Several timed shapes' speedups in one (`harness/timed_shapes.shapes_summary`): how they were
    combined (`method`); no numbers and "inconclusive" where any shape's timing is."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: Literal["faster", "slower", "within noise", "inconclusive"]
    method: str
    shapes: int


class SpecError(Open):
    """A kernel's spec or reference that failed (its `make_inputs`, its reference, its import):
    one error for the kernel, naming the spec file; its implementations are not judged."""

    spec: str
    detail: str


class ResultRow(Open):
    implementation: str
    is_baseline: bool
    compiling_state: State
    correctness_state: State
    numerics: Numerics
    verdict: str
    performance_state: State
    performance_result: PerformanceResult | None
    baseline_result: PerformanceResult | None
    samples_us: list[float] | None
    speedup: Speedup | None
    profile: dict | None
    profiler_time: ProfilerTime | None = None
    errors: list[str]
    warnings: list[str]
    failures: list[Failure] = []
    flags: list[Failure] = []  # a timing that stands but needs a look (impossible_time, untimed_work,
    # implausible_speedup, uneven_calls)
    numerics_margin: NumericsMargin | None = None
    timing_method: dict | None = None  # mode (events, graph; none on the CPU) and why
    spec_error: SpecError | None = None  # its kernel's spec failed: not judged
    shapes: list[TimedShape] | None = None  # each timed shape, in the order timed
    shapes_summary: ShapesSummary | None = None  # several timed shapes: their speedups' geometric mean


class Excluded(Open):
    implementation: str
    reason: str


class CompareReport(Open):
    """compare_report.json: one kernel's implementations, the correctness gate, the ranking."""

    kernel: str
    baseline: str | None
    ranking: list[str]
    best: str | None
    excluded: list[Excluded]
    results: list[ResultRow]
    errors: list[str]
    timing_method: dict | None = None
    spec_errors: list[SpecError] = []
    timed_shapes: list[str] = []  # the shapes and dtype the timings measured, e.g. "[64, 1024] float32"


class ImplementationSummary(BaseModel):
    """One implementation in `magpie build --json`: its comparison row's verdict in Magpie's
    keys, its outcome (report/verdicts.py's OUTCOMES) and, where `--check` fails on it, why."""

    implementation: str
    is_baseline: bool
    outcome: Literal["not_judged", "timed_out", "inconclusive", "failed", "skipped", "passed"]
    compiling_state: str
    correctness_state: str
    performance_state: str
    numerics: str
    verdict: str
    failures: list[dict]
    performance_result: dict | None
    speedup: dict | None
    expect_faster: bool
    check: str | None


class KernelSummary(BaseModel):
    kernel: str
    baseline: str | None
    best: str | None
    ranking: list[str]
    compare_report: str | None = Field(
        description="the published compare_report.json, relative to magpie.toml's "
        "folder; null where the build covered the kernel's tasks but not its "
        "comparison (their results judged as it would)"
    )
    spec_errors: list[SpecError]
    implementations: list[ImplementationSummary]


class BuildCheck(BaseModel):
    passed: bool
    problems: list[str]


class BuildSummary(BaseModel):
    """`magpie build --json`: one schema for a build that ran tasks, a no-op and `--check`."""

    executed: list[str]
    failed: list[str]
    failures: dict[str, str] = Field(description="each failed task's last error line")
    up_to_date: int
    kernels: list[KernelSummary]
    reports: dict[str, str] | None = Field(
        description="report.html and summary.md, relative to magpie.toml's folder; null where no report was built"
    )
    check: BuildCheck


class AnalyzeReport(Open):
    """analyze_report.json: one implementation judged alone."""

    kernel: str
    type: str
    source: str
    compiling_state: State
    correctness_state: State
    performance_state: State
    performance_result: PerformanceResult | None
    numerics: Numerics
    verdict: str
    errors: list[str]
    warnings: list[str] | None
    failures: list[Failure] = []
    flags: list[Failure] = []
    numerics_margin: NumericsMargin | None = None


class StagePick(Open):
    steps: int
    kept_steps: int
    reason: str
    step_mean_us: float
    kernels: int
    kernel_time_us: float
    files: list[str]


class TracelensAnalysis(Open):
    """What the TraceLens-style post-processing wrote, and in inference mode what it picked."""

    analysis_mode: Literal["pytorch", "inference"]
    outputs: list[str]
    per_stage: dict[str, dict[Literal["prefill", "decode", "prefilldecode"], StagePick]]
    picks: list[dict]
    warnings: list[str]
    errors: list[str]


class TraceInfo(Open):
    path: str
    rank: str
    device: str | None
    kernels: int
    unlinked: dict[str, int]


class GapRow(Open):
    """A gap-analysis row: Magpie's columns (Name, Calls, ...) and ours beside them."""

    name: str = Field(alias="Name")
    calls: int = Field(alias="Calls")
    total_us: float = Field(alias="Self CUDA total (us)")
    avg_us: float = Field(alias="Avg time (us)")
    pct_total: float = Field(alias="% Total")
    input_shapes: str = Field(alias="Input Shapes")


class TraceSummary(Open):
    """gap_analysis/gap_analysis.json: the compact summary of a trace analysis, for agents."""

    traces: list[TraceInfo]
    window: dict
    window_picks: list[dict]
    total_kernel_time_us: float
    top_k: int
    top: list[GapRow]
    gpu_timeline: dict
    outputs: dict
    warnings: list[str]
    errors: list[str]
    tracelens_analysis: TracelensAnalysis
    pages: list[dict]


def checked(model: type[BaseModel], report: dict) -> dict:
    """The report itself, once it matches its model (pydantic's error otherwise)."""
    model.model_validate(report)
    return report
