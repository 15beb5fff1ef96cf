"""The typed wire between magpie's processes: what the build sends an evaluator (its request and
the manifest's settings as `graph/expand.resolved_settings` resolved them, one implementation's
and its baseline's part), the commands an evaluator serves, and the answers a worker sends back.

Each is a msgspec `Struct`, decoded where it crosses into a process: a field missing or of the
wrong type is one line naming it (`WireError`), not a KeyError deep inside a job. A Struct
encodes to the JSON the dicts it replaced did, under the same keys. Light on imports (msgspec
alone): the build's process, the zygote and every worker import it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class WireError(Exception):
    """A message that does not have the form its edge expects; str() is one line naming the field."""


# -- the build's request to an evaluator -------------------------------------------------------------


class Implementation(msgspec.Struct, kw_only=True):
    """One implementation as the evaluator and its workers know it (`graph/expand._impl_params`)."""

    id: str
    type: str
    source: str
    source_files: list[str] = []
    entry: str | None = None
    working_dir: str | None = None
    env: dict[str, str] = {}
    is_baseline: bool = False
    library: str | None = None  # its compiled shared library, where a compile made one


class Testcase(msgspec.Struct, kw_only=True):
    """A kernel's testcase, its tolerances and trials resolved (a command's: none)."""

    command: str | None = None
    spec: str | None = None
    spec_files: list[str] | None = None
    reference: str = "reference"
    inputs: str = "make_inputs"
    shapes: list[list[int]] = []
    dtypes: list[str] = msgspec.field(default_factory=lambda: ["float32"])
    rtol: float | None = None
    atol: float | None = None
    trials: int | None = None
    held_out_shapes: int = 1
    working_dir: str | None = None
    env: dict[str, str] = {}

    @property
    def tolerances(self) -> tuple[float, float]:
        """A spec testcase's (rtol, atol), which the build resolves (`__post_init__` checks them)."""
        assert self.rtol is not None and self.atol is not None, "a command testcase has no tolerances"
        return self.rtol, self.atol

    def __post_init__(self) -> None:
        if self.spec is not None and None in (self.rtol, self.atol, self.trials):
            raise ValueError(f"spec testcase {self.spec} has no rtol, atol or trials (the build resolves them)")


class TimedSelection(msgspec.Struct, kw_only=True):
    """What a timing measures (`timed_shapes.timed_selection`): the first spec testcase's index,
    its timed settings, dtype and shapes; the seed and entry it depends on."""

    testcase: int | None = None
    settings: dict[str, Any] | None = None
    dtype: str | None = None
    shapes: list[list[int]] = []
    seed: int = 0
    entry: str | None = None


class TimingSettings(msgspec.Struct, kw_only=True):
    """`timing` of the manifest (`manifest.models.TimingSettings`) and the job's limits."""

    warmup_ms: float = 20.0
    budget_ms: float = 300.0
    rounds: int = 5
    max_reps: int = 100_000
    input_sets: int = 4
    threads: int = 1
    mode: Literal["auto", "events", "graph"] = "auto"
    vouched: bool = True
    between_runs: float | None = None
    implausible_speedup: float = 10.0
    disturbed_fraction: float | None = None
    timeout_s: float = 120.0
    memory_mb: int | None = None
    timed: TimedSelection | None = None


class CorrectnessSettings(msgspec.Struct, kw_only=True):
    testcases: list[Testcase]
    seed: int = 0
    entry: str | None = None
    timeout_s: float = 120.0
    memory_mb: int | None = None


class ProjectSettings(msgspec.Struct, kw_only=True):
    device: str = "cpu"


class Settings(msgspec.Struct, kw_only=True):
    """A kernel's and implementation's resolved settings, as far as the evaluator reads them."""

    correctness: CorrectnessSettings
    project: ProjectSettings
    timing: TimingSettings = msgspec.field(default_factory=TimingSettings)


class EvaluationRequest(msgspec.Struct, kw_only=True):
    """One job for an evaluator (`execution/actions._evaluate`): judge `impl`'s correctness, or time
    it beside `baseline`."""

    mode: Literal["correctness", "timing"]
    root: str
    kernel: str
    impl: Implementation
    settings: Settings
    work_dir: str
    baseline: Implementation | None = None
    input_secret: str = ""  # the build's, mixed into every input seed ("" where none)
    hide: list[str] = []  # folders a sandbox hides (the store's workspace)
    snapshots: dict[str, str] = {}  # each input of the task -> the bytes its key was computed from
    # the method the baseline's timing chose for the kernel's set, and what it measured alone
    timing_method: dict[str, Any] | None = None
    baseline_own_timing: dict[str, Any] | None = None


class ProfileRequest(msgspec.Struct, kw_only=True):
    """The process Nsight Compute profiles (`harness/profile.py`, from `execution/profile.py`): one
    implementation called `reps` times on its spec's largest case."""

    root: str
    kernel: str
    impl: Implementation
    settings: Settings
    reps: int = 1
    profiler_start: bool = False
    device: str | None = None  # where a sandbox shows its one GPU as cuda:0; else the project's


# -- the commands an evaluator serves ------------------------------------------------------------------


class Evaluate(msgspec.Struct, tag="evaluate", tag_field="op"):
    request: str  # the path of its EvaluationRequest's JSON


class Relog(msgspec.Struct, tag="relog", tag_field="op"):
    log: str


class Reset(msgspec.Struct, tag="reset", tag_field="op"):
    pass


class Exit(msgspec.Struct, tag="exit", tag_field="op"):
    pass


EvaluatorCommand = Evaluate | Relog | Reset | Exit


# -- the commands a worker serves (`harness/worker.py`), from its evaluator -----------------------------
# An offer (`inputs`, `outputs`) is how input sets reach the worker and outputs come back, which
# depends on the exchange (`harness/exchange.py`: files, or CUDA IPC handles), as a batch's region
# does on the device (`harness/regions.py`, `harness/device_region.py`).


class Load(msgspec.Struct, tag="load", tag_field="op", kw_only=True):
    """Load an implementation (`pool.WorkerPool.start`): its code (the bytes its task was keyed by,
    base64, where it is Python) or compiled library, its entry, and for a KernelBench model its
    init file and weights' seed; a spare adopted also gets its new log and compiler caches."""

    id: str
    source: str
    device: str
    seed: int
    library: str | None = None
    entry: str | None = None
    init_inputs_file: str | None = None
    init_from_module: bool = False
    threads: int = 1
    readable: list[str] = []  # of the project, what it may read once loaded (`harness.declared`)
    code: str | None = None
    log: str | None = None
    caches: dict[str, str] = {}


class Prepare(msgspec.Struct, tag="prepare", tag_field="op", kw_only=True):
    """A spare's start (`worker.prepare`): its CUDA context and timer, and Triton's launchers."""

    device: str
    triton_signatures: list[Any] | None = None


class Run(msgspec.Struct, tag="run", tag_field="op", kw_only=True):
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    out_specs: list[Any] = []


class TimedOutput(msgspec.Struct, tag="timed_output", tag_field="op", kw_only=True):
    inputs: dict[str, Any]
    outputs: dict[str, Any]


class RunOwnInputs(msgspec.Struct, tag="run_own_inputs", tag_field="op", kw_only=True):
    seed: int
    outputs_file: str


class Time(msgspec.Struct, tag="time", tag_field="op", kw_only=True):
    """A timing request to the worker's own timer: first call, warm-up, probes, a round's
    measurement or host-synchronised calls, whichever are asked for."""

    inputs: dict[str, Any]
    out_specs: list[Any] = []
    first_call: bool = False
    warmup_ms: float = 0.0
    probe: bool = False
    mode: str | None = None
    budget_ms: float = 0.0
    max_reps: int = 0
    offset: int = 0
    settings: TimingSettings | None = None  # what its method line says
    host_checks: int = 0


class BatchMap(msgspec.Struct, tag="batch_map", tag_field="op", kw_only=True):
    region: dict[str, Any]


class Batch(msgspec.Struct, tag="batch", tag_field="op", kw_only=True):
    calls: int
    graph: bool = False
    own_kernel: bool = False


class BatchHandover(msgspec.Struct, tag="batch_handover", tag_field="op", kw_only=True):
    calls: int = 0  # on a GPU how many are queued; on the CPU the evaluator ends the batch


class BatchUnmap(msgspec.Struct, tag="batch_unmap", tag_field="op"):
    pass


class BatchGraph(msgspec.Struct, tag="batch_graph", tag_field="op", kw_only=True):
    calls: int


class HandoverGraph(msgspec.Struct, tag="handover_graph", tag_field="op", kw_only=True):
    calls: int


class TritonSignatures(msgspec.Struct, tag="triton_signatures", tag_field="op"):
    pass


class Kernels(msgspec.Struct, tag="kernels", tag_field="op", kw_only=True):
    inputs: dict[str, Any]
    out_specs: list[Any] = []
    reps: int = 5


WorkerCommand = (
    Load
    | Prepare
    | Relog
    | Reset
    | Exit
    | Run
    | TimedOutput
    | RunOwnInputs
    | Time
    | BatchMap
    | Batch
    | BatchHandover
    | BatchUnmap
    | BatchGraph
    | HandoverGraph
    | TritonSignatures
    | Kernels
)


# -- decoding at an edge -----------------------------------------------------------------------------


_DECODERS: dict[Any, msgspec.json.Decoder] = {}


def decode(data: bytes | str, kind: Any, what: str) -> Any:
    """`data` (JSON) as `kind`, or WireError: "<what>: <msgspec's line, which names the field>"."""
    decoder = _DECODERS.get(kind)
    if decoder is None:  # once per type: making one takes ~40 µs, a batch request decoded with it ~2
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as err:
        raise WireError(f"{what}: {err}") from None
    except msgspec.DecodeError as err:
        raise WireError(f"{what}: not JSON ({err})") from None


def convert(value: Any, kind: Any, what: str) -> Any:
    """A decoded value (dicts and lists) as `kind`, or WireError naming the field."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as err:
        raise WireError(f"{what}: {err}") from None


def encode(message: Any) -> bytes:
    return msgspec.json.encode(message)
