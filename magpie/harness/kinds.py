"""Machine-readable failure kinds, beside the one-line verdicts and `errors` a person reads.

A failure is a record {kind, stage, detail} with, where it is known, the case it happened on
(testcase index, case label, shape, dtype, trial) and the error magnitudes the check
computed. Kinds are given where a failure is detected: a check names its own; a worker's
failure (session.WorkerFailure, whose message is the verdict) is mapped here, from how its
message starts, in one table.
"""

from __future__ import annotations

import re

from magpie.sandbox import SANDBOX_FAILED, SANDBOX_LIMIT

KINDS = (
    # output checks (checks.py)
    "allclose",
    "error_norm",
    "exact",
    "value",
    "type",
    "output_count",
    "shape",
    "dtype",
    "finite",
    "mutation",
    # an output the checks do not judge: sparse or nested (layout), on another device than its inputs
    "layout",
    "device",
    # the process that ran the code under test
    "crash",
    "timeout",
    "out_of_memory",
    "error",
    "load_error",
    "sandbox",
    "sandbox_violation",
    # measurement (calls_done_together: batches faster than the calls made alone allow), build
    # steps, and what was not run because of an earlier failure
    "timer_integrity",
    "calls_done_together",
    "compile",
    "testcase_command",
    "spec",
    "evaluator",
    "skipped",
    "not_compiled",
    "not_correct",
    # a time under the roofline floor: a failure; where the L2 may explain it, a flag
    "impossible_time",
    # no verdict: a busy machine may have caused the only failures, in every measurement
    "inconclusive_machine_busy",
    # flags: a timing that stands but needs a look (uneven_calls: mean over twice the median,
    # compared by means; disturbed_measurement: the baseline read far from its own timing, twice;
    # unbounded_calls: threads of its own kept its calls made alone from bounding its batches;
    # bounded_by_calls_alone: credited at what its calls made alone cost, above what its batches read)
    "untimed_work",
    "implausible_speedup",
    "uneven_calls",
    "disturbed_measurement",
    "unbounded_calls",
    "bounded_by_calls_alone",
)
STAGES = ("compile", "correctness", "timing")

# A worker's failure message (session.py, the evaluator's parts) -> its kind; the first pattern that
# matches the start of the message wins.
MESSAGE_KINDS = (
    (r"timeout after ", "timeout"),
    (r"(error|error while loading|error while timing [^:]*): out of memory", "out_of_memory"),
    (r"error while loading: ", "load_error"),
    # raised by the worker's check of its outputs' form (checks.check_output_forms)
    (r"(error|error while timing [^:]*): UnexpectedOutput: output \d+ is on ", "device"),
    (r"(error|error while timing [^:]*): UnexpectedOutput: output \d+ is a \w+ \(a subclass", "type"),
    (r"(error|error while timing [^:]*): UnexpectedOutput: ", "layout"),
    (r"(error|error while timing [^:]*): ", "error"),
    (r"crashed \(SIGSYS\b", "sandbox_violation"),  # killed by the seccomp filter
    (r"crashed \(|stopped answering", "crash"),
    (rf"exited with code {SANDBOX_FAILED}\b", "sandbox"),  # its sandbox could not be set up
    (rf"exited with code {SANDBOX_LIMIT}\b", "sandbox_violation"),  # over what its folders may hold
    (r"memory limit exceeded", "out_of_memory"),  # its sandbox's memory cgroup (sandbox.memory)
    (r"exited with code ", "crash"),
    (r"the timer of .* returned no samples", "timer_integrity"),
    (r"testcase spec: ", "spec"),
    (r"evaluator ", "evaluator"),
)

# What a failure record copies from a check record, when there.
WHERE = ("check", "testcase", "case", "shape", "dtype", "trial", "max_abs_err", "max_rel_err", "rel_err_norm")


def failure_kind(message: str, otherwise: str = "error") -> str:
    for pattern, kind in MESSAGE_KINDS:
        if re.match(pattern, message):
            return kind
    return otherwise


def command_kind(message: str, otherwise: str) -> str:
    """A command's (compile, command testcase) failure: its own kind unless the sandbox or the
    clock stopped it; a non-zero exit is the command's verdict, not a crash."""
    kind = failure_kind(message, otherwise)
    return kind if kind in ("timeout", "sandbox", "sandbox_violation") else otherwise


def failure(kind: str, stage: str, detail: str, where: dict | None = None) -> dict:
    record = {"kind": kind, "stage": stage, "detail": detail}
    record.update({key: where[key] for key in WHERE if where and where.get(key) is not None})
    return record
