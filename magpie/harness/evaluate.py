"""The evaluator process: judges one implementation, in a process of its own.

It builds inputs and reference outputs from the testcase spec, hands inputs to worker
processes that run the implementation (and, for timing, the baseline), and checks what
comes back. Candidate code never runs here, so it cannot patch the checks or the clock
that judges it; which is also why one evaluator may judge job after job of a build.
Usage (started by an action, through session.Worker): python -m magpie.harness.evaluate COMMAND_FD ANSWER_FD
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from magpie.harness import wire
from magpie.harness.context import EvaluationContext
from magpie.harness.correctness import correctness
from magpie.harness.declared import fresh_imports
from magpie.harness.pool import WorkerPool
from magpie.harness.timing_session import timing
from magpie.harness.wire import EvaluationRequest
from magpie.linux import namespaces
from magpie.supervision import device_lock
from magpie.supervision.process import log_to, release_memory, serve_pipes


def evaluate(request_path: str) -> dict:
    request: EvaluationRequest = wire.decode(Path(request_path).read_bytes(), EvaluationRequest, request_path)
    context = EvaluationContext(request)
    pool = WorkerPool(context)
    # its job's hard limit counts none of its waits for the device (`supervision.step_limit`)
    with device_lock.telling_waits(context.work / device_lock.WAITS_FILE):
        if request.mode == "correctness":
            with device_lock.shared(context.device):
                result = correctness(context, pool)
        else:
            result = timing(context, pool)
    result["isolation"] = pool.isolation
    result["input_secret"] = context.input_secret
    # the one GPU node its sandboxed processes opened, for the profile of the same code
    result["gpu_minors"] = pool.sandboxed_gpu_minors()
    return result


def serve(commands, answers) -> None:
    """Jobs one after another (`wire.EvaluatorCommand`): evaluate, answered with the result (over
    this pipe, which no worker holds: code under test cannot write a verdict); between jobs the
    action that ran one may park this process for the next (reset, relog)."""
    # No process of the same user (a candidate's left-over child, say) reads or writes this one's memory.
    namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)
    for line in commands:
        reply: dict[str, Any] = {"ok": True}
        try:
            command = wire.decode(line, wire.EvaluatorCommand, "evaluator command")
            if isinstance(command, wire.Exit):
                break
            if isinstance(command, wire.Evaluate):
                with fresh_imports():
                    reply["result"] = evaluate(command.request)
            elif isinstance(command, wire.Relog):
                log_to(command.log)
            else:
                release_memory()
        except (device_lock.DeviceLockError, wire.WireError) as err:  # that job's failure, in its own line
            reply = {"ok": False, "error": str(err)}
        except Exception as err:  # a bug here or in a spec: that job's failure, told in one line
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}".splitlines()[0][:500]}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def main(argv: list[str]) -> int:
    return serve_pipes(argv, serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
