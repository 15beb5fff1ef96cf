"""The one-shot benchmark's configuration and its report, as pydantic v2 models.

`BenchmarkConfig` is what `magpie benchmark ENGINE -m MODEL ...` takes. `BenchmarkReport` is
`benchmark_report.json` with every key of Magpie's `BenchmarkResult.to_dict()` (AMD-AGI/Magpie,
`modes/benchmark/result.py`), named and nested as there: `success, framework, model,
throughput{request_throughput, output_throughput, total_token_throughput, completed_requests,
total_input_tokens, total_output_tokens, duration_seconds}, latency{ttft,tpot,itl,e2el}` each
`{mean_ms, median_ms, p99_ms, std_ms}` (null where the distribution is empty, never 0.0),
`kernel_summary` (`[{name, time_ms, percent, calls}]`), `top_bottlenecks`, `tracelens_analysis`,
`gap_analysis` (with the kernel totals), `gpu_monitor`
(`gpus.GpuMonitor.summary()`, null with `gpu_monitor_reason` without a GPU), `workspace_dir`,
`execution_time`, `profiling_enabled`, `errors`, `raw_result` (the run's `bench_serve_result.json`,
as Magpie keeps the InferenceX result it parsed). Magpie's extras sit beside them: `p50_ms`, `p90_ms`,
`p95_ms`, the failed and empty request counts, goodput and peaks in `throughput`, `run_kind`,
`reward_eligible`, the run's counts (`run`), the server's life and the provenance (engine version,
model path and content hash or hub revision, the server's command line, environment that matters,
GPU allocation, magpie's version and command line, platform, host).
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from magpie.manifest.load import local_model_path
from magpie.serving.models import ServingMetrics
from magpie.serving.replacement import Replacement


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BenchmarkConfig(_Strict):
    framework: Literal["transformers", "vllm", "sglang", "atom", "external"]
    model: str
    precision: str = "auto"
    tp: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    extra_server_args: list[str] = []
    env: dict[str, str] = {}
    run_mode: Literal["local", "docker"] = Field(
        "local",
        description="local: the server as a process group of ours; docker: in a container of the "
        "engine's image (serving.docker_mode)",
    )
    docker_image: str | None = Field(None, description="docker mode's image; None: images.yaml's for the engine")
    run_kind: Literal["measurement", "diagnostic"] = Field(
        "measurement", description="diagnostic runs (profiled, or so declared) are never reward-eligible"
    )
    profiler: bool = Field(
        False,
        description="a torch profiler window over the load into torch_trace/, then "
        "the trace analysis; makes the run diagnostic (serving.profiling)",
    )
    analysis_mode: Literal["inference", "pytorch"] | None = Field(
        "inference",
        description="the profiled run's trace analysis (magpie.traces): inference splits serving steps "
        "and stages; None: the traces kept unanalysed (Magpie's tracelens disabled)",
    )
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)
    base_url: str | None = Field(None, description="a running server: nothing is started")
    endpoint: Literal["completions", "chat"] = "completions"
    concurrency: int | None = Field(None, ge=1)
    input_len: int = Field(1024, ge=1, description="prompt tokens (of `tokenizer`), or words without one")
    output_len: int = Field(128, ge=1, description="output tokens, forced where the engine allows (ignore_eos)")
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    prefix_len: int = Field(0, ge=0, description="tokens of a prefix shared by every prompt, before its input_len")
    tokenizer: str | None = Field(
        None,
        description="the tokenizer lengths are counted in (a folder or cached hub "
        "id); None: the model's own (prompt_tokenizer)",
    )
    num_prompts: int = Field(100, ge=1)
    request_rate: float = Field(
        math.inf, gt=0, description='requests/s; inf (written "inf", as vLLM writes it) sends all at once'
    )
    burstiness: float = Field(1.0, gt=0)
    num_warmups: int = Field(0, ge=0)
    seed: int = 0
    goodput: dict[Literal["ttft", "tpot", "e2el"], float] = {}
    metric_percentiles: list[float] = Field(
        [],
        description="percentiles written to bench_serve_result.json besides p50/p90/p95/p99 (vLLM's "
        "--metric-percentiles; a sweep asks for 75 and 99.9, InferenceMAX's)",
    )
    timeout_s: float = Field(3600.0, gt=0, description="the whole benchmark: server start and the load")
    ready_timeout_s: float | None = Field(None, gt=0, description="server start; None: the whole timeout")
    output_dir: str = "magpie_results"
    gpu_min_free_fraction: float = Field(0.9, ge=0.0, le=1.0, description="an idle GPU has this much memory free")
    gpu_monitor_interval_s: float = Field(1.0, gt=0, description="the GPU monitor's sampling interval")
    server_lifecycle: Literal["fresh", "reuse"] = Field(
        "fresh",
        description="reuse: keep the local server after the run and reuse a kept one whose recorded config "
        "matches (serving.lifecycle); fresh: start and stop a server of the run's own",
    )
    replacement_hook: str | None = Field(
        None,
        description="a hook folder of serving.replacement (its PYTHONPATH in `env`): the run fails unless every "
        "replacement of `replacements` is installed at start-up and called by the requests",
    )
    replacements: list[Replacement] = []

    @field_validator("metric_percentiles")
    @classmethod
    def _percentiles(cls, value: list[float]) -> list[float]:
        if any(not 0 < p < 100 for p in value):
            raise ValueError(f"metric_percentiles: each must be above 0 and below 100, got {value}")
        return value

    @field_serializer("request_rate")
    def _rate_in_strict_json(self, rate: float):
        return "inf" if math.isinf(rate) else rate

    @model_validator(mode="after")
    def _docker_starts_a_server(self):
        if self.docker_image and self.run_mode != "docker":
            raise ValueError("docker_image is docker mode's: add --run-mode docker (run_mode: docker)")
        if self.run_mode == "docker" and (self.base_url is not None or self.framework == "external"):
            raise ValueError(
                "run_mode docker starts the engine's server; --base-url (external) reaches a running "
                "one: give one of them"
            )
        if self.run_mode == "docker" and self.server_lifecycle == "reuse":
            raise ValueError(
                "--keep-server keeps local servers; docker mode starts and removes a container of its "
                "own: drop one of them"
            )
        return self

    @model_validator(mode="after")
    def _profiled_is_diagnostic(self):
        if self.profiler:  # profiling perturbs latency: such a run is never a measurement
            self.run_kind = "diagnostic"
        return self

    @model_validator(mode="after")
    def _reuse_is_unprofiled(self):
        if self.profiler and self.server_lifecycle == "reuse":
            raise ValueError(
                "server_lifecycle reuse: a profiled run starts a server of its own (its profiler "
                "writes into the run's workspace); drop --keep-server or --torch-profiler"
            )
        return self


def model_context(config: BenchmarkConfig) -> tuple[int, str] | None:
    """The most tokens a request may hold and where that comes from: `max_model_len`, else the model folder's
    config.json (`max_position_embeddings`, `n_positions`, `max_seq_len`, `seq_length`); None when unknown."""
    import json

    if config.max_model_len:
        return config.max_model_len, "--max-model-len"
    path = local_model_path(config.model)
    try:
        fields = json.loads((path / "config.json").read_text()) if path is not None else {}
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(fields.get(key), int):
            return fields[key], f"{key} in {path / 'config.json'}"
    return None


# Files of a Hugging Face model folder that hold its tokenizer (fast, sentencepiece, BPE vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def prompt_tokenizer(config: BenchmarkConfig) -> str | None:
    """Before any server starts: the tokenizer the lengths are counted in (`--tokenizer`, else the model's own
    folder or cached hub id; loaded here so a broken one is one line now), and the lengths checked against the
    model's context. None: no tokenizer to be had (an external server's model name, a folder without tokenizer
    files), lengths in words. Raises ValueError with the one line."""
    from magpie.serving.datasets import length_range, load_tokenizer

    limit = model_context(config)
    if limit is not None:
        longest = (
            config.prefix_len
            + length_range(config.input_len, config.range_ratio)[1]
            + length_range(config.output_len, config.range_ratio)[1]
        )
        if longest > limit[0]:
            raise ValueError(
                f"prompts of up to {longest} tokens with their output (prefix_len {config.prefix_len}, "
                f"input_len {config.input_len}, output_len {config.output_len}, range_ratio "
                f"{config.range_ratio:g}) do not fit the model's context of {limit[0]} ({limit[1]}): "
                f"lower --input-len / --output-len"
            )
    name = config.tokenizer
    if name is None:
        path = local_model_path(config.model)
        if path is not None and path.is_dir():
            if not any((path / f).exists() for f in TOKENIZER_FILES):
                return None  # no tokenizer to be had; the engine says what it makes of the folder
            name = str(path)
        elif path is None and hub_revision(config.model) is not None:
            name = config.model
        else:
            return None
    load_tokenizer(name)
    return name


class ServerInfo(_Strict):
    mode: Literal["local", "docker", "external"]
    base_url: str
    command: list[str] | None = None
    pid: int | None = Field(None, description="the server's process, leader of its own process group")
    log: str | None = None
    ready_after_s: float | None = None
    exit_code: int | None = Field(None, description="how the server ended: negative is the signal that ended it")
    died_during_run: bool = False
    container: str | None = Field(None, description="docker mode: the container's id (removed after the run)")
    reused: bool = Field(False, description="a server kept by an earlier run (server_lifecycle reuse) served this one")
    kept: bool = Field(False, description="left running after the run for a later one (server_lifecycle reuse)")


class Provenance(_Strict):
    magpie_version: str
    engine: str
    engine_version: str | None
    model: str
    model_path: str | None = Field(None, description="the local folder or file served")
    model_hash: str | None = Field(None, description="sha256 over the model folder's files (names and contents)")
    model_revision: str | None = None
    image: str | None = Field(None, description="docker mode: the image as named")
    image_id: str | None = Field(None, description="docker mode: the image's content id (sha256:...)")
    environment: dict[str, str] = {}
    gpu_allocation: dict[str, Any] | None = Field(
        None, description="mode auto (picked idle), pinned (a *_VISIBLE_DEVICES variable), none (no GPU), external"
    )
    python: str
    platform: str | None = None
    hostname: str | None = None
    command_line: list[str] | None = Field(None, description="magpie's own command line")
    started_at: str
    server_reused: bool = Field(
        False,
        description="served by a server an earlier run kept (server_lifecycle "
        "reuse): warm, not started for this run; `server.pid` names it",
    )
    replacements: list[dict[str, Any]] = Field(
        [],
        description="kernels put into the served model (serving.replacement): kernel, implementation, how chosen, "
        "target, source digest, correctness verdict, and the server's processes that installed and called it",
    )


class RunCounts(_Strict):
    duration_s: float
    completed: int
    failed: int
    empty: int = Field(
        0, description="completed requests whose stream carried no output text (vLLM counts them completed)"
    )
    total_input_tokens: int
    total_output_tokens: int
    max_concurrent_requests: int


class LatencyMs(BaseModel):
    """One of Magpie's latency blocks (`latency.ttft`, ...): milliseconds under Magpie's `*_ms` keys, null where no
    request gave a value (a TPOT needs a request of two tokens or more). Python reads them without the suffix."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    mean: float | None = Field(None, alias="mean_ms")
    median: float | None = Field(None, alias="median_ms")
    p99: float | None = Field(None, alias="p99_ms")
    std: float | None = Field(None, alias="std_ms", description="population standard deviation, as vLLM's")
    p50: float | None = Field(None, alias="p50_ms")
    p90: float | None = Field(None, alias="p90_ms")
    p95: float | None = Field(None, alias="p95_ms")


class ReportLatency(_Strict):
    ttft: LatencyMs
    tpot: LatencyMs
    itl: LatencyMs
    e2el: LatencyMs


class ReportThroughput(_Strict):
    """Magpie's `throughput` block (its seven keys first), then magpie's extras."""

    request_throughput: float = Field(description="completed requests/s over the run's duration")
    output_throughput: float = Field(description="output tokens/s")
    total_token_throughput: float = Field(description="input + output tokens/s")
    completed_requests: int = Field(description="requests whose stream answered without an error, empty ones too")
    total_input_tokens: int
    total_output_tokens: int
    duration_seconds: float = Field(description="first dispatch to last completion")
    failed_requests: int
    empty_requests: int = Field(description="completed requests whose stream carried no output text")
    request_goodput: float | None = Field(None, description="requests/s meeting every SLO; null without SLOs")
    max_output_tokens_per_s: float = Field(description="the busiest one-second bucket's output tokens")
    max_concurrent_requests: int


def measured_fields(outputs, metrics: ServingMetrics, vllm_result: dict) -> dict[str, Any]:
    """The report's fields of a measured run: Magpie's `throughput` and `latency`, the run's counts and the vLLM
    result as `raw_result`. Latency statistics come from the same distributions as vLLM's keys; where one is
    empty Magpie's block says null, where vLLM's file says 0 (numpy over `[0]`, as vLLM writes it)."""
    from magpie.serving.metrics import distributions, stats_ms

    dists = distributions([o for o in outputs if o.success])
    latency = ReportLatency(
        **{name: LatencyMs(**stats_ms(values)) if values else LatencyMs() for name, values in dists.items()}
    )
    thr = metrics.throughput
    throughput = ReportThroughput(
        request_throughput=thr.request_throughput,
        output_throughput=thr.output_throughput,
        total_token_throughput=thr.total_token_throughput,
        completed_requests=metrics.completed,
        total_input_tokens=metrics.total_input_tokens,
        total_output_tokens=metrics.total_output_tokens,
        duration_seconds=metrics.duration,
        failed_requests=metrics.failed,
        empty_requests=metrics.empty,
        request_goodput=thr.request_goodput,
        max_output_tokens_per_s=thr.max_output_tokens_per_s,
        max_concurrent_requests=metrics.max_concurrent_requests,
    )
    run = RunCounts(
        duration_s=metrics.duration,
        completed=metrics.completed,
        failed=metrics.failed,
        empty=metrics.empty,
        total_input_tokens=metrics.total_input_tokens,
        total_output_tokens=metrics.total_output_tokens,
        max_concurrent_requests=metrics.max_concurrent_requests,
    )
    return {"throughput": throughput, "latency": latency, "run": run, "raw_result": vllm_result}


class KernelRow(_Strict):
    """One kernel of Magpie's `kernel_summary`: its time summed over the profiled window, its share, its calls."""

    name: str
    time_ms: float
    percent: float
    calls: int


def kernel_rows(top: list[dict[str, Any]]) -> list[KernelRow]:
    """The gap analysis's top kernels (`traces.report`'s rows) as Magpie's `kernel_summary`, busiest first."""
    return [
        KernelRow(
            name=row["Name"], time_ms=row["Self CUDA total (us)"] / 1000.0, percent=row["% Total"], calls=row["Calls"]
        )
        for row in top
    ]


class BenchmarkReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success: bool
    partial: bool = Field(
        False,
        description="the run was interrupted (Ctrl-C, SIGTERM): the figures are those of "
        "the requests completed before it",
    )
    framework: str
    model: str
    throughput: ReportThroughput | None = None
    latency: ReportLatency | None = None
    kernel_summary: list[KernelRow] = Field(
        [], description="a profiled run's top GPU kernels (Magpie's list); the totals are in gap_analysis"
    )
    top_bottlenecks: list[dict[str, Any]] = []
    tracelens_analysis: dict[str, Any] | None = None
    gap_analysis: dict[str, Any] | None = None
    gpu_monitor: dict[str, Any] | None = None
    gpu_monitor_reason: str | None = Field(None, description="why gpu_monitor is null")
    workspace_dir: str
    execution_time: float
    profiling_enabled: bool = False
    run_kind: Literal["measurement", "diagnostic"] = "measurement"
    reward_eligible: bool = False
    errors: list[str] = []
    raw_result: dict[str, Any] | None = Field(None, description="the run's bench_serve_result.json (vLLM's keys)")
    run: RunCounts | None = None
    server: ServerInfo | None = None
    provenance: Provenance | None = None
    config: BenchmarkConfig
    outputs: dict[str, str] = {}


# Environment variables that change what a server does, recorded when set.
ENV_THAT_MATTERS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "OMP_NUM_THREADS",
    "VLLM_USE_V1",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_TORCH_PROFILER_DIR",
    "SGLANG_TORCH_PROFILER_DIR",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL_P2P_DISABLE",
    "TORCH_COMPILE_DISABLE",
    "CUDA_LAUNCH_BLOCKING",
)


def model_hash(path: str | Path, digests=None) -> str:
    """sha256 over a model folder: each file's relative path, size and content sha256, in name order (a file:
    its own). Each file's digest is remembered by stat (`magpie.store.digests`; by default in the user's
    cache), so multi-GB weights are read again only when they change."""
    from magpie.store.digests import FileDigests, user_digests_path

    path = Path(path)
    digests = digests if digests is not None else FileDigests(user_digests_path())
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        rel = f.name if f == path else f.relative_to(path).as_posix()
        h.update(f"{rel}\0{f.stat().st_size}\0{digests.digest(f)}\n".encode())
    digests.save()
    return h.hexdigest()


def hub_revision(model: str, environ=os.environ) -> str | None:
    """The commit a hub id resolves to in the local Hugging Face cache (`refs/main`), None when not cached."""
    if local_model_path(model) is not None or "/" not in model:
        return None
    cache = environ.get("HF_HUB_CACHE") or os.path.join(
        environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    ref = Path(cache) / ("models--" + model.replace("/", "--")) / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None
