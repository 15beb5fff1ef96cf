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

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

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
    shape: Optional[str] = None
    kernel_us: Optional[float] = None
    dispatch_overhead_us: Optional[float] = None
    flags: list[str] = []


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
    check: Optional[str] = None
    testcase: Optional[int] = None
    case: Optional[str] = None
    shape: Optional[list] = None
    dtype: Optional[str] = None
    trial: Optional[int] = None
    max_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None


class NumericsMargin(Open):
    """How close a correct implementation came: the figures of the case that used most of its
    tolerance (`tolerance_used`: max |got - expected| / (atol + rtol |expected|), 1 at the bound)."""

    max_abs_err: float
    max_rel_err: float
    rel_err_norm: float
    tolerance_used: Optional[float] = None
    case: Optional[str] = None
    trial: Optional[int] = None
    cases: int


class Speedup(Open):
    value: float
    ci_low: float
    ci_high: float
    verdict: Literal["faster", "slower", "within noise", "baseline"]


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
    performance_result: Optional[PerformanceResult]
    baseline_result: Optional[PerformanceResult]
    samples_us: Optional[list[float]]
    speedup: Optional[Speedup]
    profile: Optional[dict]
    profiler_time: Optional[ProfilerTime] = None
    errors: list[str]
    warnings: list[str]
    failures: list[Failure] = []
    flags: list[Failure] = []  # a timing that stands but needs a look (impossible_time, untimed_work,
    # implausible_speedup, uneven_calls)
    numerics_margin: Optional[NumericsMargin] = None
    timing_method: Optional[dict] = None  # mode (events, graph; none on the CPU) and why
    spec_error: Optional[SpecError] = None  # its kernel's spec failed: not judged


class Excluded(Open):
    implementation: str
    reason: str


class CompareReport(Open):
    """compare_report.json: one kernel's implementations, the correctness gate, the ranking."""

    kernel: str
    baseline: Optional[str]
    ranking: list[str]
    best: Optional[str]
    excluded: list[Excluded]
    results: list[ResultRow]
    errors: list[str]
    timing_method: Optional[dict] = None
    spec_errors: list[SpecError] = []
    timed_shapes: list[str] = []  # the shape and dtype each timing measured, e.g. "[64, 1024] float32"


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
    performance_result: Optional[dict]
    speedup: Optional[dict]
    expect_faster: bool
    check: Optional[str]


class KernelSummary(BaseModel):
    kernel: str
    baseline: Optional[str]
    best: Optional[str]
    ranking: list[str]
    compare_report: Optional[str] = Field(description="the published compare_report.json, relative to magpie.toml's "
                                          "folder; null where the build covered the kernel's tasks but not its "
                                          "comparison (their results judged as it would)")
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
    reports: Optional[dict[str, str]] = Field(description="report.html and summary.md, relative to magpie.toml's "
                                                          "folder; null where no report was built")
    check: BuildCheck


class AnalyzeReport(Open):
    """analyze_report.json: one implementation judged alone."""

    kernel: str
    type: str
    source: str
    compiling_state: State
    correctness_state: State
    performance_state: State
    performance_result: Optional[PerformanceResult]
    numerics: Numerics
    verdict: str
    errors: list[str]
    warnings: Optional[list[str]]
    failures: list[Failure] = []
    flags: list[Failure] = []
    numerics_margin: Optional[NumericsMargin] = None


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
    device: Optional[str]
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
