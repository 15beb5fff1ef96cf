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
      profiler: false            # true: a torch profiler window, traces analysed; the run is diagnostic
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
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from magpie.errors import UserError, located

EXTRA_ARGS = re.compile(r"^EXTRA_([A-Z0-9]+)_ARGS$")
ENV_KEYS = ("TP", "CONC", "ISL", "OSL", "RANDOM_RANGE_RATIO", "NUM_PROMPTS", "MAX_MODEL_LEN")


class Envs(BaseModel):
    """Magpie's workload variables; `EXTRA_<NAME>_ARGS` strings besides these."""

    model_config = ConfigDict(extra="allow")

    TP: int = Field(1, ge=1)
    CONC: Optional[int] = Field(None, ge=1)
    ISL: int = Field(1024, ge=1)
    OSL: int = Field(128, ge=1)
    RANDOM_RANGE_RATIO: float = Field(0.0, ge=0.0, lt=1.0)
    NUM_PROMPTS: Optional[int] = Field(None, ge=1, description="default: 10 x CONC, or 100 without CONC")
    MAX_MODEL_LEN: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _extras(self):
        for key, value in (self.model_extra or {}).items():
            if not EXTRA_ARGS.match(key):
                raise ValueError(f"unknown variable {key!r} (known: {', '.join(ENV_KEYS)}, EXTRA_<FRAMEWORK>_ARGS, "
                                 f"EXTRA_SERVER_ARGS; server environment variables go under benchmark.env)")
            if not isinstance(value, str):
                raise ValueError(f"{key}: give the arguments as one string, e.g. \"--enforce-eager\"")
        return self


class Profiler(BaseModel):
    model_config = ConfigDict(extra="allow")
    enabled: bool = False


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
    profiler: Union[bool, Profiler] = False
    run_mode: Literal["local", "docker"] = "local"
    docker_image: Optional[str] = None
    run_kind: Literal["measurement", "diagnostic"] = "measurement"
    gpu_selection: Union[Literal["auto"], list[int], GpuSelection] = "auto"
    timeout_seconds: float = Field(3600.0, gt=0)
    base_url: Optional[str] = None


class BenchmarkFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    benchmark: BenchmarkSection


def _server_args(path: Path, section: BenchmarkSection) -> list[str]:
    import shlex

    args: list[str] = []
    for key, value in (section.envs.model_extra or {}).items():
        name = EXTRA_ARGS.match(key).group(1)
        if name not in ("SERVER", section.framework.upper()):
            raise located(path, f"benchmark.envs.{key}", f"arguments for {name.lower()}, but the framework is "
                          f"{section.framework}: name it EXTRA_{section.framework.upper()}_ARGS or remove it")
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


def load_benchmark_config(path: str | Path, **overrides):
    """The YAML at `path` as a `BenchmarkConfig`; `overrides` (output_dir, host, port, base_url, endpoint, ...)
    are set on top. Raises `UserError` (one line) on any mistake."""
    import yaml

    from magpie.manifest.kernel_config import _yaml_error
    from magpie.manifest.load import describe_validation_error, read_text
    from magpie.serving.report import BenchmarkConfig

    path = Path(path)
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        raise UserError(_yaml_error(path, err)) from None
    if not isinstance(data, dict) or "benchmark" not in data:
        raise UserError(f"{path}: expected a top-level 'benchmark:' mapping (framework, model, envs, ...)")
    try:
        section = BenchmarkFile.model_validate(data).benchmark
    except ValidationError as err:
        raise describe_validation_error(path, err) from None
    profiler = section.profiler if isinstance(section.profiler, bool) else section.profiler.enabled
    env = dict(section.env)
    gpus = _gpus(section)
    if gpus is not None:
        if not gpus:
            raise located(path, "benchmark.gpu_selection", "manual selection with no gpu_ids: list the devices")
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))
        env.setdefault("HIP_VISIBLE_DEVICES", ",".join(map(str, gpus)))
    e = section.envs
    model = section.model
    if model.startswith(("./", "../")):       # relative to the YAML's folder
        model = str((path.resolve().parent / model).resolve())
    fields = dict(framework=section.framework, model=model, precision=section.precision, tp=e.TP,
                  max_model_len=e.MAX_MODEL_LEN, extra_server_args=_server_args(path, section), env=env,
                  concurrency=e.CONC, input_len=e.ISL, output_len=e.OSL, range_ratio=e.RANDOM_RANGE_RATIO,
                  num_prompts=e.NUM_PROMPTS or (10 * e.CONC if e.CONC else 100), run_kind=section.run_kind,
                  profiler=profiler, run_mode=section.run_mode, docker_image=section.docker_image,
                  timeout_s=section.timeout_seconds, base_url=section.base_url)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BenchmarkConfig(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        raise located(path, ".".join(map(str, first["loc"])) or "benchmark",
                      first["msg"].removeprefix("Value error, ")) from None
