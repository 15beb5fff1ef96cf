"""The project manifest (`magpie.toml`) as pydantic v2 models.

Every path is kept as written (relative to the manifest's folder); `load.py` checks
that the files exist once the shape of the document is known to be right.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator, model_validator

from magpie.manifest.sweep_axes import SweepAxes

KernelType = Literal["pytorch", "triton", "cuda", "hip"]
PYTHON_TYPES = ("pytorch", "triton")
IDENT = r"^[A-Za-z0-9_.\-]+$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimingSettings(Strict):
    warmup_ms: float = Field(20.0, ge=0)
    budget_ms: float = Field(
        300.0,
        gt=0,
        description="measured time per implementation (on a GPU, vouched: the wall "
        "time of its timed batches, their inputs drawn and outputs checked included)",
    )
    rounds: int = Field(5, ge=1, description="interleaved baseline/candidate rounds")
    max_reps: int = Field(100_000, ge=1)
    input_sets: int = Field(
        4, ge=1, description="GPU: fresh input sets rotated between calls (on the CPU every timed call gets new ones)"
    )
    threads: int = Field(1, ge=1, description="torch intra-op threads on the CPU")
    mode: Literal["auto", "events", "graph"] = Field(
        "auto",
        description="how a GPU kernel is timed, for the baseline and every candidate alike: auto chooses "
        "from the baseline's probe (CUDA-graph replays under 10 µs per call, else events around each call)",
    )
    timed_by: Literal["evaluator", "worker"] = Field(
        "evaluator",
        description="who times a GPU kernel's calls: evaluator, batches of calls on input sets of new seeds "
        "timed by the evaluator's own clock and proven by their outputs, as the CPU always is; worker, CUDA "
        "events or graph replays timed in the worker's process, which code under test can forge "
        "(docs/security.md). `vouched = true/false`, its older spelling, is still read",
    )
    between_runs: float | None = Field(
        None,
        ge=0,
        description="how much a speedup varies between runs of the "
        "same comparison (relative standard deviation), added to each interval; "
        "default: the device's, as measured by bench/interval_coverage.py (a GPU "
        "1%, an H200's 0.9%; the CPU 6.5%, a 2-core VM's); measure yours with it",
    )
    implausible_speedup: float = Field(
        10.0,
        gt=1,
        description="a speedup above this is timed again on fresh "
        "inputs: labelled if it holds, the timing failed if it does not",
    )
    disturbed_fraction: float | None = Field(
        None,
        ge=0,
        description="a baseline that reads more than this "
        "fraction off its own timing beside a candidate has that measurement "
        "taken again (flagged if it still does); default: the device's, 10% "
        "on a GPU, 25% on the CPU (above what an undisturbed baseline reads "
        "apart between jobs: docs/performance.md)",
    )
    shapes: list[list[int]] | None = Field(
        None,
        description="the shapes timed, each one of the first spec testcase's (in its first dtype): a "
        "speedup for each and their geometric mean; default: its first shape. A shape only checked "
        "for correctness is in no timing's key",
    )

    @model_validator(mode="before")
    @classmethod
    def _older_vouched(cls, data):
        """`vouched` (true: the evaluator times, false: the worker), `timed_by`'s older spelling, read as it."""
        if not isinstance(data, dict) or "vouched" not in data:
            return data
        data = dict(data)
        vouched = data.pop("vouched")
        if not isinstance(vouched, bool):
            raise ValueError("timing.vouched (the older spelling of timing.timed_by) is true or false")
        said = "evaluator" if vouched else "worker"
        if data.setdefault("timed_by", said) != said:
            raise ValueError("timing.timed_by and the older timing.vouched disagree: give timed_by alone")
        return data

    @field_validator("shapes")
    @classmethod
    def _timed_shapes(cls, shapes):
        if shapes is not None and not shapes:
            raise ValueError("give at least one shape, or leave timing.shapes out (its first declared shape)")
        for shape in shapes or []:
            check_shape(shape)
        return shapes


class ProfileSettings(Strict):
    """Bounds of a hardware-counter profile (Nsight Compute): how much of an implementation it
    replays, and for how long at most."""

    launches_per_kernel: int = Field(
        3,
        ge=1,
        description="profile the first N launches of each distinct kernel "
        "(a kernel name with one grid, block and shared-memory size)",
    )
    max_launches: int = Field(48, ge=1, description="profile at most this many launches in all")
    max_timeout_s: float = Field(
        600.0, gt=0, description="ceiling of the timeout derived from the implementation's measured time"
    )


class Defaults(Strict):
    trials: int = Field(3, ge=1)
    seed: int = 0
    rtol: float = Field(1e-5, ge=0)
    atol: float = Field(1e-6, ge=0)
    timeout_s: float = Field(120.0, gt=0, description="per evaluation subprocess")
    memory_mb: int | None = Field(
        None,
        ge=256,
        description="memory limit of a candidate process, all it holds (docs/security.md); "
        "default: a share of the machine's memory, half of it over two workers a job (-j)",
    )
    timing: TimingSettings = TimingSettings()
    profile: ProfileSettings = ProfileSettings()


class ProjectSettings(Strict):
    name: str = "magpie-project"
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="cpu, cuda or cuda:N (ROCm too)")
    devices: list[NonNegativeInt] | None = Field(
        None,
        min_length=1,
        description="with device = cuda: the GPU indices a build places its jobs on (--devices overrides); "
        "default: every visible GPU",
    )
    workspace: str = "workspaces"
    cuda_arch: str | None = Field(None, pattern=r"^(sm|compute)_\d+a?$", description="nvcc -arch; default: detected")
    trust_code: bool = Field(False, description="run code under test without a sandbox, where none can be set up")


class StoreSettings(Strict):
    trusted_signers: list[str] = Field(
        [],
        description="public keys (`magpie key` on the machine that signed) whose "
        "artifacts this project uses as its own; an artifact signed "
        "by any other key is built again here",
    )
    cache: str | None = Field(
        None,
        description="a shared cache of artifacts, a folder (relative to magpie.toml's): a build takes from it "
        "what it lacks, each artifact verified (digests, a trusted signer) before use (--cache overrides)",
    )
    cache_write: bool = Field(
        False, description="a build also puts what it built into the cache (--cache-write); read-only by default"
    )

    @field_validator("trusted_signers")
    @classmethod
    def _signers(cls, value: list[str]) -> list[str]:
        from magpie.store.signing import well_formed_signer

        for signer in value:
            if not well_formed_signer(signer):
                raise ValueError(
                    f'{signer!r} is not a signer: give "ed25519:" and 64 lowercase hex digits, as '
                    f"`magpie key` prints them"
                )
        return value


class Implementation(Strict):
    id: str = Field(pattern=IDENT)
    source: str
    type: KernelType | None = None
    entry: str | None = None
    source_files: list[str] = []
    working_dir: str | None = None
    env: dict[str, str] = {}
    compile_command: str | None = None
    expect_faster: bool = Field(
        False,
        description="`magpie build --check` fails unless this implementation is "
        "correct and faster than the baseline beyond noise (in no task's key: changing it "
        "re-runs nothing)",
    )


class Testcase(Strict):
    """Either a command whose exit code decides, or a Python reference spec."""

    command: str | None = None
    spec: str | None = None
    spec_files: list[str] | None = Field(
        None,
        description="the project's files the spec imports besides "
        "itself (its tasks are keyed by them; another is refused)",
    )
    reference: str = "reference"
    inputs: str = "make_inputs"
    shapes: list[list[int]] = []
    dtypes: list[str] = ["float32"]
    rtol: float | None = Field(None, ge=0)
    atol: float | None = Field(None, ge=0)
    trials: int | None = Field(None, ge=1)
    held_out_shapes: int = Field(
        1,
        ge=0,
        description="shapes drawn per build from its secret seed for each declared one "
        "(same rank and dtype, sizes around the declared ones, neither powers of two nor "
        "multiples of 16) on which a spec's cases are checked too; 0: none",
    )
    working_dir: str | None = None
    env: dict[str, str] = {}

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.command is None) == (self.spec is None):
            raise ValueError("give exactly one of 'command' (exit code decides) or 'spec' (Python reference)")
        return self

    @field_validator("shapes")
    @classmethod
    def _no_empty_dimensions(cls, shapes):
        for shape in shapes:
            check_shape(shape)
        return shapes

    @field_validator("dtypes")
    @classmethod
    def _known_dtypes(cls, dtypes):
        for name in dtypes:
            if name not in DTYPES:
                raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})")
        return dtypes


def check_shape(shape: list[int]) -> None:
    """Refuse a dimension below 1: an empty tensor gives an empty output, and every
    implementation, however wrong, matches an empty reference."""
    bad = next((d for d in shape if d < 1), None)
    if bad is not None:
        raise ValueError(
            f"shape {shape} has a dimension of {bad}: every dimension must be at least 1 "
            f"(on an empty tensor any implementation passes)"
        )


DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")


class Kernel(Strict):
    id: str = Field(pattern=IDENT)
    type: KernelType
    entry: str | None = None
    baseline: Implementation | None = None
    candidates: list[Implementation] = []
    testcases: list[Testcase] = []
    kernelbench: str | None = Field(
        None,
        description="a KernelBench problem file (Model, get_inputs(), get_init_inputs()), "
        "relative to magpie.toml: the reference of implementations that define ModelNew; "
        "it is the kernel's last testcase (a spec testcase of that file)",
    )
    held_out_shapes: int | None = Field(
        None, ge=0, description="its testcases' held_out_shapes where they set none; 0 opts the kernel out"
    )
    rtol: float | None = Field(None, ge=0)
    atol: float | None = Field(None, ge=0)
    trials: int | None = Field(None, ge=1)
    timeout_s: float | None = Field(None, gt=0)
    timing: TimingSettings | None = None
    replaces: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$",
        description="what this kernel replaces in a served model, a Python path (`package.module.Class.method`, "
        "or `package.module:Class.method`): a `[[benchmark]]`'s `use` puts an implementation in its place "
        "(docs/architecture/serving.md)",
    )
    replaces_with: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the function of each implementation's source installed in place of `replaces`, with the "
        "target's own signature (self first for a method); default: the kernel's entry",
    )

    @model_validator(mode="before")
    @classmethod
    def _kernel_wide_testcases(cls, data):
        """A KernelBench problem becomes a spec testcase of its file, last (the indices of the
        testcases written keep to the manifest); the kernel's held_out_shapes becomes its
        testcases' default. What is not a table is left for the fields' own errors."""
        if not isinstance(data, dict) or not isinstance(data.get("testcases", []), list):
            return data
        testcases = list(data.get("testcases", []))
        if isinstance(data.get("kernelbench"), str):
            testcases.append({"spec": data["kernelbench"]})
        if isinstance(data.get("held_out_shapes"), int) and data["held_out_shapes"] >= 0:  # else its own error
            testcases = [
                {"held_out_shapes": data["held_out_shapes"], **tc} if isinstance(tc, dict) else tc for tc in testcases
            ]
        return {**data, "testcases": testcases}

    @model_validator(mode="after")
    def _unique_ids(self):
        seen = set()
        for impl in self.implementations():
            if impl.id in seen:
                raise ValueError(f"implementation id {impl.id!r} is used twice")
            seen.add(impl.id)
        if not seen:
            raise ValueError("declare a 'baseline' or at least one entry in 'candidates'")
        return self

    def implementations(self) -> list[Implementation]:
        return ([self.baseline] if self.baseline else []) + list(self.candidates)

    def impl_type(self, impl: Implementation) -> str:
        return impl.type or self.type


class TraceSet(Strict):
    """A folder of PyTorch profiler traces, analysed by the trace_analysis rule."""

    id: str = Field(pattern=IDENT)
    dir: str = Field(description="folder of .json / .json.gz traces, relative to magpie.toml")
    analysis_mode: Literal["pytorch", "inference"] = "pytorch"
    top_k: int = Field(20, ge=1)
    steady_state: bool = False
    arch: str | None = Field(None, description="accelerator when the traces do not name one")
    kernel_source_repos: list[str] = Field([], description="repositories to map top kernels to source")


class BenchmarkLoad(Strict):
    """The load of a declared benchmark (vLLM `bench serve`'s meaning of each)."""

    concurrency: int | None = Field(None, ge=1, description="requests in flight at most; none: no limit")
    input_len: int = Field(1024, ge=1)
    output_len: int = Field(128, ge=1)
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="lengths uniform over len*(1±ratio)")
    prefix_len: int = Field(0, ge=0, description="tokens of a prefix shared by every prompt (--random-prefix-len)")
    tokenizer: str | None = Field(
        None,
        min_length=1,
        description="the tokenizer lengths are counted in: a folder "
        "(relative to magpie.toml) or cached hub id; none: the model's own",
    )
    num_prompts: int = Field(100, ge=1)
    request_rate: float = Field(float("inf"), gt=0, description="requests/s; inf: all at once")
    burstiness: float = Field(1.0, gt=0)
    num_warmups: int = Field(0, ge=0)
    seed: int = 0
    endpoint: Literal["completions", "chat"] = "completions"


class BenchmarkSLO(Strict):
    """Service-level objectives: the run's goodput counts the requests that meet all of them."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)


class ABSettings(Strict):
    """The A/B of a benchmark that puts kernels in (`use`): the workload with and without them."""

    pairs: int = Field(3, ge=2, description="interleaved runs without (A) and with (B) the replacement: ABAB...")
    gate_prompts: int = Field(8, ge=1, description="prompts of the output-equivalence gate, greedy on both sides")
    gate_max_tokens: int = Field(16, ge=1, description="tokens each gate prompt generates (temperature 0)")


class BenchmarkSpec(Strict):
    """A serving benchmark built by the `benchmark` rule (rules/serving.toml) into benchmark_report.json."""

    id: str = Field(pattern=IDENT)
    engine: Literal["transformers", "vllm", "sglang", "atom", "external"]
    model: str = Field(min_length=1, description="model folder (relative to magpie.toml) or hub id")
    precision: str = "auto"
    tp: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    extra_server_args: list[str] = []
    env: dict[str, str] = {}
    base_url: str | None = Field(None, description="a running server (engine external): nothing is started")
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="default: the engine's")
    run_mode: Literal["local", "docker"] = Field(
        "local", description="docker: the server in a container of docker_image, or of images.yaml's for the engine"
    )
    docker_image: str | None = Field(None, description="docker mode's image (on this machine: nothing is pulled)")
    run_kind: Literal["measurement", "diagnostic"] = "measurement"
    profiler: bool = Field(
        False,
        description="also a separate profiled (diagnostic) run and the trace analysis "
        "of its traces, each a node of its own; the measurement stays clean",
    )
    keep_server: bool = Field(
        False,
        description="leave the local server running after a clean run, for the next "
        "benchmark (of this build or a later one) whose server's recorded "
        "config matches: engine and version, model content, command line, "
        "environment, port; `magpie clean` stops it. Not in the result's key",
    )
    load: BenchmarkLoad = BenchmarkLoad()
    slo: BenchmarkSLO = BenchmarkSLO()
    timeout_s: float = Field(3600.0, gt=0, description="the whole run, server start included")
    sweep: SweepAxes | None = Field(
        None,
        description="load settings swept (concurrency, request_rate, input_len, output_len: every combination "
        "over `load`): one node per point, cached on its own, the points run one after another against one "
        "server, and a benchmark_sweep node with the table and the Pareto plot",
    )
    repeats: int | None = Field(None, ge=1, description="runs of each sweep point, for its intervals (default 3)")
    use: dict[str, str] = Field(
        {},
        description='kernels put into the served model: kernel id -> "best" (its comparison\'s winner) or an '
        "implementation id; the benchmark_ab node runs the workload with and without them (ABAB...)",
    )
    ab: ABSettings = ABSettings()

    @model_validator(mode="after")
    def _external_has_url(self):
        if self.engine == "external" and not self.base_url:
            raise ValueError("engine 'external' benchmarks a running server: give its base_url")
        if self.docker_image and self.run_mode != "docker":
            raise ValueError('docker_image is docker mode\'s: add run_mode = "docker"')
        if self.repeats is not None and self.sweep is None:
            raise ValueError("repeats: the runs of each sweep point; give sweep = { concurrency = [1, 2, 4] } too")
        if self.sweep is not None and (self.profiler or self.run_mode == "docker"):
            raise ValueError(
                "sweep: a sweep's points run against one local server kept up across them: drop "
                + ("profiler (profile a point as a benchmark of its own)" if self.profiler else 'run_mode = "docker"')
            )
        if self.keep_server and (self.run_mode == "docker" or self.engine == "external"):
            raise ValueError(
                'keep_server keeps a local server of magpie\'s: drop it, or use run_mode = "local" '
                "with an engine that starts one"
            )
        return self


class Manifest(Strict):
    project: ProjectSettings = ProjectSettings()
    defaults: Defaults = Defaults()
    store: StoreSettings = StoreSettings()
    kernel: list[Kernel] = []
    rule: list[dict] = []
    benchmark: list[BenchmarkSpec] = []
    traces: list[TraceSet] = []

    @model_validator(mode="after")
    def _unique_ids(self):
        for kind, items in (("kernel", self.kernel), ("traces", self.traces), ("benchmark", self.benchmark)):
            seen = set()
            for item in items:
                if item.id in seen:
                    raise ValueError(f"{kind} id {item.id!r} is used twice")
                seen.add(item.id)
        kernels = {k.id: k for k in self.kernel}
        for bench in self.benchmark:
            for kernel_id, chosen in bench.use.items():
                kernel = kernels.get(kernel_id)
                if kernel is None:
                    raise ValueError(
                        f"benchmark {bench.id!r}: use names kernel {kernel_id!r}, which is not declared "
                        f"(kernels: {', '.join(kernels) or 'none'})"
                    )
                if kernel.replaces is None:
                    raise ValueError(
                        f"benchmark {bench.id!r}: use names kernel {kernel_id!r}, which declares no `replaces` "
                        f"(what it takes the place of in the served model)"
                    )
                if kernel.replaces_with is None and kernel.entry is None:
                    raise ValueError(
                        f"kernel {kernel_id!r}: give replaces_with, the function of its implementations put in "
                        f"place of {kernel.replaces!r} (or an entry)"
                    )
                if kernel.type not in PYTHON_TYPES:
                    raise ValueError(
                        f"benchmark {bench.id!r}: use names kernel {kernel_id!r} of type {kernel.type}: only "
                        f"pytorch and triton kernels are put into a served model"
                    )
                ids = [i.id for i in kernel.implementations()]
                if chosen != "best" and chosen not in ids:
                    raise ValueError(
                        f'benchmark {bench.id!r}: use = {{ {kernel_id} = {chosen!r} }}: give "best" or one of '
                        f"its implementations ({', '.join(ids)})"
                    )
            if bench.use and (bench.engine == "external" or bench.sweep is not None or bench.run_mode == "docker"):
                raise ValueError(
                    f"benchmark {bench.id!r}: use puts kernels into local servers of magpie's under one load: "
                    f"drop use, or its sweep, external engine or docker run_mode"
                )
        return self
