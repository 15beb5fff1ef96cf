"""The correctness job: each testcase's cases run in a worker and compared with the spec's
reference (`run_cases`, also the timing job's re-check), a testcase command run in the
sandbox and judged by its exit code, or, with no testcase, the implementation run on its
own inputs and checked for finite outputs (numerics unverified)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from magpie import environment, sandbox
from magpie.harness.checks import all_finite, compare_inputs, compare_outputs
from magpie.harness.context import EvaluationContext
from magpie.harness.exchange import load_left
from magpie.harness.held_out import failed_verdict, held_out_cases
from magpie.harness.judging import correctness_verdict, not_judged, skipped
from magpie.harness.kinds import command_kind, failure, failure_kind
from magpie.harness.laps import Laps
from magpie.harness.pool import WorkerPool
from magpie.harness.spec import ReferenceSpec, SpecError, output_specs
from magpie.harness.wire import Testcase
from magpie.supervision import scratch as scratch_folders
from magpie.supervision import zygote
from magpie.supervision.session import Worker, WorkerFailure, signal_verdict


def correctness(context: EvaluationContext, pool: WorkerPool) -> dict:
    testcases = context.correctness_settings.testcases
    impl, device = context.impl, context.device
    laps = Laps()
    worker_steps: list[dict | None] = []
    checks: list[dict] = []
    # the shapes drawn besides the declared ones, as checked, and what was skipped: reported apart
    held_out: dict = {"shapes": [], "notes": []}
    numerics = "verified"
    index = None  # the testcase a failure below happened in
    try:
        if not testcases:
            return _unverified(context, pool)
        for index, testcase in enumerate(testcases):
            if testcase.command:
                checks.append(_command_check(context, pool, index, testcase))
                continue
            if impl.type in ("cuda", "hip") and device == "cpu":
                return skipped(
                    f"{impl.type} implementations are loaded on a GPU device only; this project's device is {device}"
                )
            spec = context.spec(index, testcase)
            assert testcase.trials is not None  # a spec testcase's, resolved by the build (`wire.Testcase`)
            cases = spec.cases(context.seed, context.kernel_id, index, testcase.trials)
            init_file = context.init_file(spec)
            with pool.start(impl, init_file, wait=False) as worker:
                laps.mark("start")
                records = run_cases(
                    context,
                    pool,
                    worker,
                    spec,
                    cases,
                    f"tc{index}",
                    *testcase.tolerances,
                    laps,
                    worker_steps,
                )
                if all(r["passed"] for r in records):
                    records += _held_out_checks(context, pool, worker, spec, index, testcase, held_out)
                    laps.mark("held_out")
            laps.mark("park")  # the worker reset and parked for the timing job (or ended)
            checks.extend({"testcase": index, **r} for r in records)
    except SpecError as err:  # raised while a spec testcase of index was set up or run
        assert index is not None
        return not_judged("correctness", str(testcases[index].spec), err, index)
    except WorkerFailure as err:
        where = {"testcase": index, **({"case": err.case} if isinstance(err, _HeldOutFailure) else {})}
        kind = failure_kind(err.cause if isinstance(err, _HeldOutFailure) else str(err))
        return {
            "correctness_state": "FAILED",
            "numerics": numerics,
            "verdict": str(err),
            "checks": checks,
            "errors": [str(err)],
            "failures": [failure(kind, "correctness", str(err), where)],
            "held_out": held_out,
        }
    return {
        **failed_verdict(correctness_verdict(checks, numerics)),
        "held_out": held_out,
        "warnings": list(held_out["notes"]),
        "phases_s": laps.seconds,
        "worker_steps_s": worker_steps,
        "worker_loads_s": pool.worker_loads,
    }


def _held_out_checks(
    context: EvaluationContext,
    pool: WorkerPool,
    worker: Worker,
    spec: ReferenceSpec,
    index: int,
    testcase: Testcase,
    held_out: dict,
) -> list[dict]:
    """The testcase's held-out cases (`harness/held_out.py`), each in a request of its own so that
    a call that raises names its shape; what was checked and skipped goes into `held_out`."""
    cases, notes = held_out_cases(spec, context.seed, context.kernel_id, index, testcase, context.init_seed)
    held_out["notes"] += notes
    records = []
    for k, case in enumerate(cases):
        held_out["shapes"].append(case.label.removeprefix("held-out "))
        try:
            records += run_cases(context, pool, worker, spec, [case], f"tc{index}-held-out{k}", *testcase.tolerances)
        except WorkerFailure as err:
            raise _HeldOutFailure(case.label, str(err)) from None
    return records


class _HeldOutFailure(WorkerFailure):
    """A held-out case's call failed, the declared ones having passed: `cause` is the worker's
    message, whose start says its kind."""

    def __init__(self, case: str, cause: str):
        super().__init__(f"incorrect: passes declared shapes, fails {case}: {cause}")
        self.case, self.cause = case, cause


def run_cases(
    context: EvaluationContext,
    pool: WorkerPool,
    worker: Worker,
    spec: ReferenceSpec,
    cases: list,
    tag: str,
    rtol,
    atol,
    laps: Laps | None = None,
    worker_steps: list | None = None,
) -> list[dict]:
    """Each case's inputs run by the worker in one request, its outputs compared with the
    reference and its inputs checked for changes: one record per case. `worker_steps` gets
    where the worker's time went."""
    laps = laps or Laps()
    exchange = context.exchange
    inputs = [spec.make_inputs(c) for c in cases]
    laps.mark("inputs")
    expected = [spec.reference(a, context.init_seed) for a in inputs]
    laps.mark("reference")
    folder = worker.scratch or context.work
    outputs = exchange.offer_outputs(tag, expected, inputs, folder)
    pool.loaded(worker)
    laps.mark("offer")
    answer = worker.request(
        {
            "op": "run",
            "inputs": exchange.offer_inputs(tag, inputs, folder),
            "outputs": outputs,
            "out_specs": [output_specs(e) for e in expected],
        },
        context.timeout,
    )
    if not answer["ok"]:
        raise WorkerFailure(f"error: {pool.undeclared(worker, answer['error'])}")
    laps.mark("run")
    if worker_steps is not None:
        worker_steps.append(answer.get("steps_s"))
    produced = exchange.collect(outputs, answer)
    exchange.release()
    laps.mark("collect")
    records = []
    for i, case in enumerate(cases):
        record = compare_inputs(inputs[i], produced["inputs_after"][i])
        if record is None:
            record = compare_outputs(produced["outputs"][i], expected[i], rtol, atol)
        records.append(
            {
                "case": case.label,
                "shape": case.shape,
                "dtype": case.dtype,
                "trial": case.trial,
                "seed": case.seed,
                **({"held_out": True} if case.held_out else {}),
                **record,
            }
        )
    laps.mark("compare")
    return records


def _unverified(context: EvaluationContext, pool: WorkerPool) -> dict:
    """No testcase: the implementation runs on its own get_inputs() (inside its worker) and
    only finiteness is checked, recorded as numerics: unverified."""
    impl = context.impl
    source = context.root / impl.source
    if impl.type not in ("pytorch", "triton") or "def get_inputs" not in source.read_text():
        return skipped("no testcase declared: add a [[kernel.testcases]] with a spec or a command")
    with pool.start(impl, None, init_from_module=True) as worker:
        outputs_file = str((worker.scratch or context.work) / "outputs.pt")
        answer = worker.request(
            {"op": "run_own_inputs", "seed": context.seed, "outputs_file": outputs_file}, context.timeout
        )
        if not answer["ok"]:
            raise WorkerFailure(f"error: {answer['error']}")
        produced = load_left(context.torch, outputs_file)
        if not produced["outputs"]:
            raise WorkerFailure("error: its output file holds no outputs")
    record = {"testcase": None, "case": "get_inputs()", "trial": 0, **all_finite(produced["outputs"][0])}
    return correctness_verdict([record], "unverified")


def _command_check(context: EvaluationContext, pool: WorkerPool, index: int, testcase: Testcase) -> dict:
    impl, timeout = context.impl, context.timeout
    cwd = context.root / (testcase.working_dir or ".")
    scratch = scratch_folders.make("testcase-", owner=os.getpid())
    env = {
        **context.env(impl),
        **testcase.env,
        "TMPDIR": str(scratch),
        environment.IMPL_ID: impl.id,
        environment.IMPL_SOURCE: str(context.root / impl.source),
    }
    # The command runs the implementation: it reads the project, writes only its TMPDIR.
    policy = (
        None
        if sandbox.trusted()
        else sandbox.Policy(
            write=[str(scratch)],
            read=[str(context.root), str(cwd)],
            hide=context.hide,
            gpu=context.device != "cpu",
            gpu_minors=pool.gpu_minors,
        )
    )
    pool.isolation = sandbox.describe(policy)
    started = time.monotonic()
    output = scratch / "output.log"  # read back by its end only: a command may print gigabytes
    # Forked from the zygote, which enters the sandbox and then executes the command: no
    # interpreter to start per command.
    argv = ["/bin/sh", "-c", str(testcase.command)]
    proc = zygote.launch(
        "magpie.sandbox.__main__",
        [json.dumps(policy.to_json() if policy else None), "--", *argv],
        cwd=str(cwd),
        env=env,
        log_path=output,
    )
    try:
        returncode = proc.wait(timeout=timeout)
        tail = scratch_folders.last_lines(output)
    except subprocess.TimeoutExpired:
        return {
            "testcase": index,
            "case": "command",
            "trial": 0,
            "passed": False,
            "check": "exit code",
            "kind": "timeout",
            "detail": f"timeout after {timeout:g} s",
        }
    finally:
        proc.kill()  # its process group, whatever the command left
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    passed = returncode == 0
    detail = "" if passed else f"{signal_verdict(returncode)}: {tail}"
    return {
        "testcase": index,
        "case": "command",
        "trial": 0,
        "passed": passed,
        "check": "exit code",
        "kind": None if passed else command_kind(detail, "testcase_command"),
        "detail": detail,
        "wall_s": time.monotonic() - started,
    }
