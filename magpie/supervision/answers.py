"""The form of a worker's answer, the worker-to-evaluator edge of the typed wire
(`harness/wire.py` types the others). The code under test runs in the worker's process and can
write to its answer pipe ahead of the worker; an answer whose fields have the wrong types would
otherwise fail later, inside the evaluator, and read as the evaluator's error. Checked here, it
is the worker's failure."""

from __future__ import annotations

from typing import Any

import msgspec


class WorkerAnswer(msgspec.Struct, kw_only=True):
    """Every field a worker's answer may carry (`magpie.harness.worker`), each typed; fields no
    command answers with are left as they are (nothing reads them)."""

    ok: bool
    error: str | None = None
    traceback: str | None = None
    steps_s: dict[str, float] | None = None
    started_unix: float | None = None
    prepared: bool | None = None
    outputs_in_file: bool | None = None
    index: int | None = None
    threads: int | None = None
    pid: int | None = None
    probe_us: float | None = None
    launch_us: float | None = None
    samples_ns: list[float] | None = None
    info: dict[str, Any] | None = None
    method: str | None = None
    host_wall_median_us: float | None = None
    loop_ns: int | None = None
    kernel_us: float | None = None
    kernels: dict[str, float] | None = None
    # `signatures` (a Triton worker's) is left as it comes: `triton_warmup.signatures` keeps what is well formed


def wrong_fields(answer: dict) -> str | None:
    """What is wrong with an answer's fields, in one line (msgspec's, naming the field); None where
    nothing is."""
    try:
        msgspec.convert(answer, WorkerAnswer)
    except msgspec.ValidationError as err:
        return str(err)
    return None
