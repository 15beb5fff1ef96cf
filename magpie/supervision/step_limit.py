"""The hard wall-clock limit of a step that judges code under test (a correctness or a timing
job), kept by the job's own process, above the evaluator and its workers.

The evaluator bounds each of its waits on a worker by `timeout_s`, and more for a batch the
worker's own sizing said would take long; but it cannot bound itself: a candidate that makes
its sizing read slow widens every later batch's allowance, a step is many such waits, and an
evaluator starved of a CPU, or stuck itself, keeps no deadline at all. So the job that asked for the
evaluation gives it a limit derived from its settings alone: past it the evaluator is killed
(`session.Worker.receive`), the zygote kills the workers it had asked for as it sees it gone
(`zygote_server.Children.heard_from`), and the verdict is `timeout after N s`. Time the evaluator
spends waiting for the device lock is not counted (`device_lock.waited_s`): under -j N a
timing job waits for every other job's measurement, none of which is its own doing.
"""

from __future__ import annotations

# What a step may take beside the waits its settings bound: the evaluator's and its workers'
# start (fork, sandbox, imports its spec makes), inputs, references and checks, on a machine
# busy with other jobs (several runnable processes per core).
ALLOWANCE_S = 30.0
# How much wall time a timing step may take per millisecond of its warm-up and measured
# budget: each measurement times the baseline and the candidate, with its sizing, calls made
# alone and first uses on top, an implausible speedup is timed again, a disturbed one
# re-measured, and on a busy machine the CPU time a budget counts takes several times as
# long in wall time.
TIMING_BUDGET_FACTOR = 20


def step_limit_s(mode: str, settings: dict) -> float:
    """The hard limit of a step in seconds. Correctness: `timeout_s` for the worker's load and
    one for each testcase (each a run, or a command, the evaluator bounds by it). Timing: one
    `timeout_s` for the workers' load and, per timed shape (`timing.shapes`, measured one after
    the other), one for their first calls and the measurement's budget, TIMING_BUDGET_FACTOR
    times over. Both with ALLOWANCE_S."""
    correctness = settings["correctness"]
    timeout = float(correctness["timeout_s"])
    if mode == "correctness":
        return timeout * (max(1, len(correctness["testcases"])) + 1) + ALLOWANCE_S
    timing = settings["timing"]
    budget_s = (float(timing["warmup_ms"]) + float(timing["budget_ms"])) / 1000
    shapes = max(1, len((timing.get("timed") or {}).get("shapes") or ()))
    return timeout + shapes * (timeout + TIMING_BUDGET_FACTOR * budget_s) + ALLOWANCE_S


def timeout_line(mode: str, limit_s: float, waited_s: float) -> str:
    """The verdict of a step killed at its limit."""
    waits = f", not counting {waited_s:.0f} s waiting for the device" if waited_s >= 0.5 else ""
    return (
        f"timeout after {limit_s:g} s: the {mode} step's limit{waits} (from timeout_s and the timing budget); "
        "its evaluator and workers were killed"
    )
