"""The tools' results, as pydantic models: each tool's output schema is its model's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

JobState = Literal["running", "succeeded", "failed", "cancelled", "lost"]
JobKind = Literal["build", "analyze", "compare", "benchmark", "gap_analysis", "compare_traces"]


class JobView(BaseModel):
    """A job: what it runs, how far it is, and its result once it has one."""

    job_id: str
    kind: JobKind
    state: JobState = Field(description="lost: its process ended without recording a result")
    step: str | None = Field(None, description="the step running (a build's task), or the last")
    done: int = Field(0, description="steps finished (a build's tasks)")
    total: int | None = Field(None, description="steps in all, where known")
    created: float | None = None
    finished: float | None = None
    error: str | None = Field(None, description="why it failed, in one line")
    result: dict | None = Field(
        None, description="the result, inline where it is small; else read result_uri (a resource)"
    )
    result_uri: str | None = Field(None, description="the result as a resource (magpie://jobs/ID/result)")


class JobList(BaseModel):
    jobs: list[JobView]


class PlannedTask(BaseModel):
    task: str
    why: str = Field(description="why it is stale: never built, an input changed (which), forced, ...")


class ProjectStatus(BaseModel):
    root: str
    kernels: list[str]
    stale: list[PlannedTask] = Field(description="what a build would run, in run order, and why")
    up_to_date: int
    running_jobs: list[str]


class CleanResult(BaseModel):
    removed: int
    stopped_servers: list[str]


class BadArtifact(BaseModel):
    task: str | None
    key: str
    problem: str
    current: bool


class VerifyResult(BaseModel):
    checked: int
    bad: list[BadArtifact]
    removed: bool


class Speedup(BaseModel):
    value: float
    ci_low: float
    ci_high: float
    verdict: str


class ImplementationVerdict(BaseModel):
    implementation: str
    is_baseline: bool
    verdict: str
    compiling_state: str
    correctness_state: str
    performance_state: str
    failure_kinds: list[str]
    errors: list[str]
    median_us: float | None
    speedup: Speedup | None
    clock_state: str | None = Field(
        None, description="the GPU's clocks and power while it was timed, in one line (none where not timed)"
    )
    clocks: dict | None = Field(None, description="the clock record (performance_result.clocks): readings, limits")


class KernelReport(BaseModel):
    kernel: str
    baseline: str | None
    best: str | None
    ranking: list[str]
    timed_shapes: list[str]
    timing_method: dict | None = Field(description="how it was timed (the mode, and why)")
    implementations: list[ImplementationVerdict]
    compare_report: str = Field(description="the published compare_report.json, relative to the project root")


class ReportResult(BaseModel):
    kernels: list[KernelReport]
    report_html: str | None


class WrittenCandidate(BaseModel):
    kernel: str
    candidate: str
    source: str = Field(description="the file written, relative to the project root")
    replaced: bool = Field(description="the candidate was declared already (its source replaced)")
    bytes: int


class GpuInfo(BaseModel):
    gpus: list[dict]
    cpu: dict
    compilers: dict
    profilers: dict
    packages: dict


class TraceAnalysis(BaseModel):
    traces: list[dict]
    total_kernel_time_us: float
    top: list[dict] = Field(description="the kernels that take the time, by total contribution")
    warnings: list[str]
    outputs: dict[str, str] = Field(description="files written, relative to the project root")


class KernelSource(BaseModel):
    kernel: str
    symbol: str
    state: str = Field(description="resolved, ambiguous, library or unresolved")
    file: str | None = Field(None, description="where it is defined, relative to the project root")
    line: int | None = None
    candidates: list[dict] = Field([], description="ambiguous: every definition of the name")
    library: str | None = Field(None, description="a known library's kernel (cuBLAS, ...): no source to edit")


class KernelSources(BaseModel):
    kernels: list[KernelSource]


class TraceComparison(BaseModel):
    summary: dict
    outputs: dict[str, str]


class BenchmarkResultInfo(BaseModel):
    result_id: str
    framework: str | None
    model: str | None
    success: bool | None
    run_kind: str | None
    throughput: dict | None
    report: str = Field(description="benchmark_report.json, relative to the project root")


class BenchmarkResults(BaseModel):
    results: list[BenchmarkResultInfo]


class BenchmarkComparison(BaseModel):
    comparison: dict
