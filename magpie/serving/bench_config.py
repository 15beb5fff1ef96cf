"""Magpie's `benchmark:` YAML (`magpie benchmark --benchmark-config bench.yaml`) mapped onto `BenchmarkConfig`.

    benchmark:
      framework: vllm            # transformers, vllm, sglang, atom, external
      model: meta-llama/Llama-3.1-8B
      precision: bf16
      envs:                      # Magpie's names for the workload
        TP: 1
        CONC: 16                 # requests in flight at most
        ISL: 1024                # input length
        OSL: 128                 # output length
        RANDOM_RANGE_RATIO: 0.0
        NUM_PROMPTS: 160
        MAX_MODEL_LEN: 4096
        EXTRA_VLLM_ARGS: "--enforce-eager"   # EXTRA_<FRAMEWORK>_ARGS or EXTRA_SERVER_ARGS: the server's
      env: {OMP_NUM_THREADS: "8"}            # the server's environment
      tokenizer: ./tok           # lengths in its tokens (a folder, ./ relative to this file, or a cached hub id;
                                 # default: the model's own), as --tokenizer
      random_prefix_len: 0       # tokens of a prefix shared by every prompt, as --random-prefix-len
      sweep: {concurrency: [1, 2, 4]}  # a sweep (concurrency, request_rate, input_len, output_len: every
                                 # combination) against one server, as --sweep; envs give the rest of the load,
                                 # NUM_PROMPTS (default 10 x CONC, else 100) the same at every point
      repeats: 3                 # runs of each sweep point (default 3), as --repeats
      profiler: false            # true: a torch profiler window, traces analysed; the run is diagnostic
      # or Magpie's block (keys magpie has no counterpart for only at the value matching what magpie does):
      # profiler:
      #   torch_profiler: {enabled: true}                           # the profiled, diagnostic run
      #   tracelens: {enabled: true, analysis_mode: inference}      # or pytorch; disabled: traces kept unanalysed
      #   gpu_monitor: {interval_sec: 1.0}
      run_mode: local            # or docker: the server in a container (magpie/serving/docker_mode.py)
      docker_image: vllm/vllm-openai:latest  # docker mode's image; default: magpie/serving/images.yaml's
      run_kind: measurement      # or diagnostic (never reward-eligible)
      gpu_selection: auto        # or a list of device indices: CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES
      timeout_seconds: 3600

Every mistake is one `UserError` line naming the file, the field and what to do (the CLI exits 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from magpie.errors import UserError, located
from magpie.manifest.sweep_axes import SweepAxes

EXTRA_ARGS = re.compile(r"^EXTRA_([A-Z0-9]+)_ARGS$")
ENV_KEYS = ("TP", "CONC", "ISL", "OSL", "RANDOM_RANGE_RATIO", "NUM_PROMPTS", "MAX_MODEL_LEN")


class Envs(BaseModel):
    """Magpie's workload variables; `EXTRA_<NAME>_ARGS` strings besides these."""

    model_config = ConfigDict(extra="allow")

    TP: int = Field(1, ge=1)
    CONC: int | None = Field(None, ge=1)
    ISL: int = Field(1024, ge=1)
    OSL: int = Field(128, ge=1)
    RANDOM_RANGE_RATIO: float = Field(0.0, ge=0.0, lt=1.0)
    NUM_PROMPTS: int | None = Field(None, ge=1, description="default: 10 x CONC, or 100 without CONC")
    MAX_MODEL_LEN: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _extras(self):
        for key, value in (self.model_extra or {}).items():
            if not EXTRA_ARGS.match(key):
                raise ValueError(
                    f"unknown variable {key!r} (known: {', '.join(ENV_KEYS)}, EXTRA_<FRAMEWORK>_ARGS, "
                    f"EXTRA_SERVER_ARGS; server environment variables go under benchmark.env)"
                )
            if not isinstance(value, str):
                raise ValueError(f'{key}: give the arguments as one string, e.g. "--enforce-eager"')
        return self


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def _only(self, **what_magpie_does):
        """Magpie's keys whose other values magpie has no counterpart for: one line naming the value it takes."""
        for key, (value, why) in what_magpie_does.items():
            if getattr(self, key) != value:
                raise ValueError(
                    f"{key}: {getattr(self, key)!r} is not supported: {why}; set {key}: "
                    f"{_yaml_word(value)} or remove it"
                )
        return self


def _yaml_word(value) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, str(value)) if not isinstance(value, str) else value


class TorchProfiler(_Block):
    enabled: bool = True


class SystemProfiler(_Block):
    enabled: bool = False
    profile_args: list[str] = []

    @model_validator(mode="after")
    def _not_run(self):
        return self._only(enabled=(False, "magpie records torch profiler traces, not rocprof-compute or ncu runs"))


class TraceLens(_Block):
    """Magpie's trace analysis settings; magpie analyses the traces itself (magpie.traces), so the keys that
    install or patch TraceLens (auto_patch_runtime, tracelens_repo_path) have nothing to act on."""

    enabled: bool = False
    analysis_mode: Literal["inference", "pytorch"] = "inference"
    analysis_stages: Literal["all"] | list[Literal["prefilldecode", "decode", "prefill"]] = "all"
    export_format: Literal["csv", "excel"] = "csv"
    perf_report_enabled: bool = True
    multi_rank_report_enabled: bool = True
    gpu_arch_config: str | None = None
    auto_patch_runtime: bool = True
    tracelens_repo_path: str | None = None

    @model_validator(mode="after")
    def _what_magpie_writes(self):
        return self._only(
            analysis_stages=("all", "magpie's inference analysis reports every stage"),
            export_format=("csv", "magpie writes CSV tables"),
            perf_report_enabled=(True, "magpie always writes the performance report"),
            multi_rank_report_enabled=(True, "magpie always reports across the traces"),
            gpu_arch_config=(None, "magpie takes the accelerator from the trace"),
        )


class GpuMonitor(_Block):
    enabled: bool = True
    interval_sec: float = Field(1.0, gt=0)  # magpie's sampling interval unless given (Magpie's is 2 s)
    device_id: int | None = None

    @model_validator(mode="after")
    def _always_on(self):
        return self._only(
            enabled=(True, "magpie monitors the GPUs of every run"),
            device_id=(None, "magpie monitors the run's allocated devices (gpu_selection)"),
        )


class Profiler(_Block):
    """`profiler: true|false`, magpie's `{enabled: ...}`, or Magpie's block: `torch_profiler` (a profiled,
    diagnostic run), `tracelens` (its trace analysis; `analysis_mode` inference or pytorch), `system_profiler`,
    `gpu_monitor`."""

    enabled: bool | None = None
    torch_profiler: TorchProfiler | None = None
    system_profiler: SystemProfiler = SystemProfiler()
    tracelens: TraceLens | None = None
    gpu_monitor: GpuMonitor = GpuMonitor()

    @model_validator(mode="before")
    @classmethod
    def _switch(cls, data):
        return {"enabled": data} if isinstance(data, bool) else data

    @model_validator(mode="after")
    def _one_switch(self):
        if self.enabled is not None and self.torch_profiler is not None:
            raise ValueError("give either enabled (magpie's switch) or torch_profiler.enabled (Magpie's), not both")
        tracelens = self.tracelens is not None and self.tracelens.enabled
        if tracelens and not self.records:
            raise ValueError(
                "tracelens analyses the torch profiler's traces: set torch_profiler.enabled: true "
                "or tracelens.enabled: false"
            )
        return self

    @property
    def records(self) -> bool:
        """A torch profiler window over the load."""
        if self.enabled is not None:
            return self.enabled
        return self.torch_profiler is not None and self.torch_profiler.enabled

    @property
    def analysis_mode(self) -> str | None:
        """The trace analysis's mode; None: the traces are kept unanalysed (Magpie's block without tracelens
        enabled). Magpie's own switch (`true`, `enabled`) analyses in inference mode."""
        if self.enabled is not None:
            return "inference"
        if self.tracelens is None or not self.tracelens.enabled:
            return None
        return self.tracelens.analysis_mode


class GpuSelection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "manual"] = "auto"
    gpu_ids: list[int] = []


class BenchmarkSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    framework: Literal["transformers", "vllm", "sglang", "atom", "external"]
    model: str = Field(min_length=1)
    precision: str = "auto"
    envs: Envs = Envs()
    env: dict[str, str] = {}
    profiler: Profiler = Profiler()
    run_mode: Literal["local", "docker"] = "local"
    docker_image: str | None = None
    run_kind: Literal["measurement", "diagnostic"] = "measurement"
    gpu_selection: Literal["auto"] | list[int] | GpuSelection = "auto"
    timeout_seconds: float = Field(3600.0, gt=0)
    base_url: str | None = None
    tokenizer: str | None = Field(None, min_length=1)
    random_prefix_len: int = Field(0, ge=0)
    sweep: SweepAxes | None = None
    repeats: int | None = Field(None, ge=1, description="runs of each sweep point (default 3)")

    @model_validator(mode="after")
    def _repeats_of_a_sweep(self):
        if self.repeats is not None and self.sweep is None:
            raise ValueError("repeats: the runs of each sweep point; give sweep: {concurrency: [1, 2, 4]} too")
        return self


class BenchmarkFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    benchmark: BenchmarkSection


def _server_args(path: Path, section: BenchmarkSection) -> list[str]:
    import shlex

    args: list[str] = []
    for key, value in (section.envs.model_extra or {}).items():
        name = EXTRA_ARGS.match(key).group(1)
        if name not in ("SERVER", section.framework.upper()):
            raise located(
                path,
                f"benchmark.envs.{key}",
                f"arguments for {name.lower()}, but the framework is "
                f"{section.framework}: name it EXTRA_{section.framework.upper()}_ARGS or remove it",
            )
        try:
            args += shlex.split(value)
        except ValueError as err:
            raise located(path, f"benchmark.envs.{key}", f"cannot split into arguments: {err}") from None
    return args


def _gpus(section: BenchmarkSection) -> list[int] | None:
    sel = section.gpu_selection
    if isinstance(sel, list):
        return sel
    if isinstance(sel, GpuSelection) and (sel.mode == "manual" or sel.gpu_ids):
        return sel.gpu_ids
    return None


def _beside(path: Path, name: str | None) -> str | None:
    """A `./` or `../` path relative to the YAML's folder; other names (hub ids, absolute paths) as written."""
    if name is not None and name.startswith(("./", "../")):
        return str((path.resolve().parent / name).resolve())
    return name


def _section(path: Path) -> BenchmarkSection:
    import yaml

    from magpie.manifest.kernel_config import _yaml_error
    from magpie.manifest.load import describe_validation_error, read_text

    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        raise UserError(_yaml_error(path, err)) from None
    if not isinstance(data, dict) or "benchmark" not in data:
        raise UserError(f"{path}: expected a top-level 'benchmark:' mapping (framework, model, envs, ...)")
    try:
        return BenchmarkFile.model_validate(data).benchmark
    except ValidationError as err:
        raise describe_validation_error(path, err) from None


def load_benchmark_sweep(path: str | Path) -> tuple[SweepAxes | None, int | None]:
    """The YAML's `sweep` (None: a single run) and `repeats` (None: the default). Raises `UserError` (one line)."""
    section = _section(Path(path))
    return section.sweep, section.repeats


def load_benchmark_config(path: str | Path, **overrides):
    """The YAML at `path` as a `BenchmarkConfig`; `overrides` (output_dir, host, port, base_url, endpoint, ...)
    are set on top. Raises `UserError` (one line) on any mistake."""
    from magpie.serving.report import BenchmarkConfig

    path = Path(path)
    section = _section(path)
    env = dict(section.env)
    gpus = _gpus(section)
    if gpus is not None:
        if not gpus:
            raise located(path, "benchmark.gpu_selection", "manual selection with no gpu_ids: list the devices")
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))
        env.setdefault("HIP_VISIBLE_DEVICES", ",".join(map(str, gpus)))
    e = section.envs
    model, tokenizer = (_beside(path, name) for name in (section.model, section.tokenizer))
    fields = dict(
        framework=section.framework,
        model=model,
        precision=section.precision,
        tp=e.TP,
        max_model_len=e.MAX_MODEL_LEN,
        extra_server_args=_server_args(path, section),
        env=env,
        concurrency=e.CONC,
        input_len=e.ISL,
        output_len=e.OSL,
        range_ratio=e.RANDOM_RANGE_RATIO,
        num_prompts=e.NUM_PROMPTS or (10 * e.CONC if e.CONC else 100),
        run_kind=section.run_kind,
        prefix_len=section.random_prefix_len,
        tokenizer=tokenizer,
        profiler=section.profiler.records,
        # unprofiled here, --torch-profiler may still profile it: then magpie's default analysis
        analysis_mode=section.profiler.analysis_mode if section.profiler.records else "inference",
        run_mode=section.run_mode,
        docker_image=section.docker_image,
        timeout_s=section.timeout_seconds,
        base_url=section.base_url,
        gpu_monitor_interval_s=section.profiler.gpu_monitor.interval_sec,
    )
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BenchmarkConfig(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        raise located(
            path, ".".join(map(str, first["loc"])) or "benchmark", first["msg"].removeprefix("Value error, ")
        ) from None
