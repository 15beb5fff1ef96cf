"""What a job's checks and measurements mean as a verdict: the correctness verdict and its
margin, the records of a timing's failures and flags (each beside its line in errors or
warnings), a timing that is inconclusive or not judged, a baseline disturbed beside its
candidate, the second measurement of an implausible speedup, and the per-role summaries the
report shows. Functions of what was measured; nothing here runs code or touches a worker."""

from __future__ import annotations

import math
from pathlib import Path

from magpie.compare.stats import summarize_ns
from magpie.harness.checks import as_tuple
from magpie.harness.kinds import failure
from magpie.harness.measurement import (
    DEFAULT_DISTURBED_FRACTION,
    INCONCLUSIVE,
    alone_line,
    for_device,
    implausible_speedup,
    paired_speedup,
    roofline_floor,
    timer_inconsistency,
    uneven_calls,
    uneven_line,
    unvouched_on_a_busy_machine,
    wall_check,
)
from magpie.harness.rounds import Rounds, batch_phases
from magpie.harness.spec import SpecError
from magpie.harness.wire import Implementation

# What the summary keeps of each round: the mode, the timer's own clock around its loop and the
# evaluator's around the request.
ROUND_INFO = ("mode", "loop_wall_ms", "request_wall_ms")


# -- correctness ----------------------------------------------------------------------------
def correctness_verdict(checks: list[dict], numerics: str) -> dict:
    if numerics == "verified" and checks and all(c.get("case") == "command" for c in checks):
        numerics = "checked by the testcase command"  # no Python reference: exit codes judged the outputs
    failed = next((c for c in checks if not c["passed"]), None)
    if failed is None:
        verdict = "runs, output finite (numerics unverified)" if numerics == "unverified" else "correct"
        return {
            "correctness_state": "SUCCESS",
            "numerics": numerics,
            "verdict": verdict,
            "checks": checks,
            "errors": [],
            "failures": [],
            "numerics_margin": numerics_margin(checks),
        }
    where = f" on {failed['case']} trial {failed['trial']}" if failed.get("case") != "command" else ""
    errs = ""
    if "max_abs_err" in failed:
        errs = f" (max abs err {failed['max_abs_err']:.3g}, max rel err {failed['max_rel_err']:.3g})"
    verdict = f"incorrect: {failed['check']}{where}: {failed['detail']}{errs}"
    # every failing case, the one the verdict names first
    failures = [failure(c.get("kind") or c["check"], "correctness", c["detail"], c) for c in checks if not c["passed"]]
    return {
        "correctness_state": "FAILED",
        "numerics": numerics,
        "verdict": verdict,
        "checks": checks,
        "errors": [verdict],
        "failures": failures,
    }


def numerics_margin(checks: list[dict]) -> dict | None:
    """How close a correct implementation came to its tolerance: the error figures of the case
    that used most of it (tolerance_used 1 is the allclose bound), and how many cases were compared."""
    compared = [c for c in checks if "max_abs_err" in c]
    if not compared:
        return None
    worst = max(compared, key=lambda c: (c.get("tolerance_used", 0.0), c["max_rel_err"]))
    keys = (
        "max_abs_err",
        "max_rel_err",
        "rel_err_norm",
        "tolerance_used",
        "testcase",
        "case",
        "shape",
        "dtype",
        "trial",
    )
    return {**{k: worst[k] for k in keys if k in worst}, "cases": len(compared)}


def skipped(reason: str) -> dict:
    return {
        "correctness_state": "SKIPPED",
        "numerics": "unverified",
        "verdict": f"skipped: {reason}",
        "checks": [],
        "errors": [reason],
        "failures": [failure("skipped", "correctness", reason)],
    }


def not_judged(stage: str, spec: str, err: SpecError, testcase: int | None) -> dict:
    """The spec (its import, inputs or reference) failed, not the implementation: the result
    names the spec file in `spec_error`, which the comparison reports once for the kernel, and
    the implementation is not judged (SKIPPED, not FAILED)."""
    detail = str(err).removeprefix(f"{Path(spec).name}: ")  # SpecError names the file: here by its path
    line = f"not judged: spec error in {spec}: {detail}"
    result = {
        "verdict": line,
        "errors": [line],
        "spec_error": {"spec": spec, "detail": detail},
        "failures": [failure("spec", stage, detail, {"testcase": testcase})],
    }
    if stage == "correctness":
        return {"correctness_state": "SKIPPED", "numerics": "unverified", "checks": [], **result}
    return {"performance_state": "SKIPPED", "performance_result": None, **result}


# -- timing -----------------------------------------------------------------------------------
def not_timed(state: str, kind: str, error: str, testcase: int | None = None) -> dict:
    return {
        "performance_state": state,
        "performance_result": None,
        "errors": [error],
        "failures": [failure(kind, "timing", error, {"testcase": testcase})],
    }


def record(result: dict, key: str, kind: str, detail: str, case, testcase: int) -> None:
    """A timing failure ("failures") or flag ("flags") on the timed case, beside its line in errors or warnings."""
    where = {"testcase": testcase, "case": case.label, "shape": case.shape, "dtype": case.dtype}
    result.setdefault(key, []).append(failure(kind, "timing", detail, where))


def flag_uneven(result: dict, summary: dict, who: str, paired: bool, case, testcase: int) -> None:
    """An `uneven_calls` flag: the summary's line, a warning, the record."""
    line = uneven_line(summary["mean_us"], summary["median_us"], paired)
    summary.setdefault("flags", []).append(line)
    result["warnings"].append(f"{who}: {line}")
    record(result, "flags", "uneven_calls", f"{who}: {line}", case, testcase)


def fail(result: dict, kind: str, detail: str, case, testcase: int) -> None:
    """The timing fails: its line in errors, its record in failures."""
    result["performance_state"] = "FAILED"
    result["errors"].append(detail)
    record(result, "failures", kind, detail, case, testcase)


def inconclusive(result: dict, doubts: list[str], shares: list[float], case, testcase: int) -> None:
    """The timing's only failures are ones a busy machine may have caused, in every measurement
    (`Rounds.in_doubt`): no verdict. What they read stays in the warnings; not stored as final
    (`INCONCLUSIVE`), the next build measures it again."""
    waits = ", ".join(f"{share:.0%}" for share in shares)
    line = (
        f"inconclusive: machine busy: its threads waited for a CPU {waits} of the time they could run in "
        f"{len(shares)} measurement(s), each read near a limit a busy machine can cross: {'; '.join(doubts)}"
    )
    result["performance_state"] = INCONCLUSIVE
    result["warnings"].extend(f"in doubt: {error}" for error in result["errors"])
    result["errors"] = [line]
    result["failures"] = []
    record(result, "failures", "inconclusive_machine_busy", line, case, testcase)


def probe_waited(measured: Rounds) -> str | None:
    """What failed, where the only failures are probes after a batch that waited (`gpu_idle`):
    on the H200 one probe after an honest baseline's batch, in 90 measurements, took 1.2 ms
    against an idle 24 µs. Work a worker leaves behind its batches fails the one taken again."""
    failures = list(measured.failed.items())
    if not failures or any(failure["check"] != "gpu_idle" for _, failure in failures):
        return None
    return "; ".join(f"{role}: {failure['detail']}" for role, failure in failures)


def disturbed(measured: Rounds, case, fraction: float | None, own: dict, device: str) -> str | None:
    """Where the baseline's median beside this candidate is more than `fraction`
    (`timing.disturbed_fraction`) off its median in its own timing job (`own`: same case, same method), what was seen; else
    None. Jobs of one build read one baseline within 1.5% on the H200; one of 80 read it 67%
    slow (and its candidate 22%) and credited 2.32x where the other runs said 1.71x: the
    device was not the measurement's alone."""
    if own.get("shape") != case.label or not own.get("median_us") or not measured.samples.get("baseline"):
        return None
    here = summarize_ns(measured.samples["baseline"])["median_us"]
    ratio = here / own["median_us"]
    if abs(math.log(ratio)) <= math.log1p(for_device(fraction, DEFAULT_DISTURBED_FRACTION, device)):
        return None
    return (
        f"the baseline read {here:.4g} µs beside this candidate and {own['median_us']:.4g} µs in its own "
        f"timing ({ratio:.2f}x): something else ran on the device"
    )


def method_line(impl: Implementation | None, method: str, device: str) -> str:
    if impl is not None and impl.type == "triton" and device == "cpu":
        method += "; Triton ran in its CPU interpreter (TRITON_INTERPRET=1): not GPU performance"
    return method


def worker_timer_summary(samples_ns: list[int], wall_s: float, account: dict, method: str, case: str) -> dict:
    """A role's samples from the timer in its worker, with the wall-clock check of its account."""
    summary = summarize_ns(samples_ns)
    summary.update(
        method=method,
        shape=case,
        wall_per_call_us=wall_s * 1e6 / account["calls"],
        wall_account={"wall_s": wall_s, **account},
        **wall_check(wall_s, account, summary["median_us"]),
    )
    return summary


def summaries(
    measured: Rounds, case, kernels: dict, impls: dict[str, Implementation | None], device: str
) -> dict[str, dict]:
    """Each role's summary of a measurement (`impls`: each role's implementation), with its
    kernel profile where one was taken."""
    summaries = {}
    for role in measured.samples:
        method = method_line(impls[role], measured.methods[role], device)
        if measured.vouched:
            calls = sum(measured.calls[role])
            summaries[role] = {
                **summarize_ns(measured.samples[role]),
                "method": method,
                "shape": case.label,
                "clock": "evaluator",
                "batches": len(measured.samples[role]),
                "calls": calls,
                "calls_per_round": measured.calls[role],
                "wall_per_call_us": measured.wall[role] * 1e6 / max(calls, 1),
                "harness_us_per_call": measured.harness_ns / 1000,
                # what was taken off its calls (`harness_taken_off`), and each run that priced it
                "harness_taken_off_us": measured.subtracted_ns.get(role, 0.0) / 1000,
                "harness_runs_us": [round(ns / 1000, 3) for ns in measured.harness_runs_ns] or None,
                "cpu_wait_share": measured.cpu_wait_share,
                "round_trip_us": measured.fixed_ns / 1000,
                "calibration_us": measured.calibration_ns[role] / 1000 if role in measured.calibration_ns else None,
                "sizing_us_per_call": measured.per_call_ns[role] / 1000 if role in measured.per_call_ns else None,
                "from_own_timing": measured.reused.get(role),
                "batch_phases": {
                    "batches": batch_phases(measured.phases[role]),
                    "calibration_batches": measured.calibration_phases,
                }
                if measured.phases.get(role)
                else None,
                # on a GPU, every batch (round, calls, µs on the events): what
                # `fixed_cost` drew its line through
                "device_batches": [[r, n, round(ns / 1000, 3)] for r, ns, n, _ in measured.device_batches[role]]
                or None,
                "outputs_checked": measured.checked.get(role, 0),
                "alone_bound": measured.alone_bound if role == "candidate" else None,
            }
        else:
            infos = measured.infos[role]
            summaries[role] = worker_timer_summary(
                measured.samples[role], measured.wall[role], measured.account[role], method, case.label
            )
            summaries[role]["timer_info"] = {**infos[-1], "host_wall_median_us": measured.host_wall.get(role)}
            summaries[role]["early_rounds_ms"] = measured.early[role]
            summaries[role]["rounds_info"] = [{k: v for k, v in info.items() if k in ROUND_INFO} for info in infos]
        summary = summaries[role]
        if role in kernels:
            summary["kernel_us"] = kernels[role].get("kernel_us")
            summary["kernels"] = kernels[role].get("kernels")
            if summary["kernel_us"]:
                summary["dispatch_overhead_us"] = summary["median_us"] - summary["kernel_us"]
            if kernels[role].get("from_own_timing"):  # also where the worker's timer measured
                summary["from_own_timing"] = sorted({*(summary.get("from_own_timing") or []), "kernels"})
    return summaries


def judge_retiming(
    result: dict,
    retimed: Rounds,
    threshold: float,
    case,
    spec_index: int,
    impls: dict[str, Implementation | None],
    device: str,
    statistic: str = "median",
    between_runs: float = 0.0,
) -> None:
    """The second measurement of an implausible speedup: checked like the first (its calls
    made alone too), then either a label on the first (`speedup["implausible"]`, a flag) or
    the timing's failure. Its speedup is the ratio of the same statistic as the first's."""
    again = summaries(retimed, case, {}, impls, device)
    result["retiming"] = {"performance_result": again["candidate"], "baseline_result": again["baseline"]}
    flagged = {f["detail"].split(":", 1)[0] for f in result.get("flags", []) if f["kind"] == "uneven_calls"}
    for role, failed in retimed.failed.items():
        fail(
            result,
            failed["kind"],
            f"{role}, re-timed: {failed['where']}: {failed['check']}: {failed['detail']}",
            case,
            spec_index,
        )
    for role, summary in again.items():
        problem = None if retimed.vouched else timer_inconsistency(summary, device)
        if problem:
            fail(result, "timer_integrity", f"{role}, re-timed: {problem}", case, spec_index)
        if role not in flagged and uneven_calls(summary["mean_us"], summary["median_us"]):
            flag_uneven(result, summary, f"{role}, re-timed", True, case, spec_index)
    if retimed.alone_bound and retimed.alone_bound["failed"]:
        fail(result, "calls_done_together", f"candidate, re-timed: {alone_line(retimed.alone_bound)}", case, spec_index)
        # the re-timing is not measured again: a failure only its baseline's disagreeing readings
        # made (`Rounds.in_doubt`) leaves the timing inconclusive, for the next build to retry
        doubts = retimed.in_doubt()
        if doubts and {f["kind"] for f in result.get("failures", [])} == {"calls_done_together"}:
            assert retimed.cpu_wait_share is not None  # in doubt: its share was read
            inconclusive(result, [f"re-timed: {doubt}" for doubt in doubts], [retimed.cpu_wait_share], case, spec_index)
    if result["performance_state"] != "SUCCESS":
        return
    second = paired_speedup(retimed.for_speedup(statistic), again["baseline"]["median_us"], statistic, between_runs)
    label, line = implausible_speedup(result["speedup"], second, threshold)
    result["speedup"]["implausible"] = label
    if unvouched_on_a_busy_machine(label["confirmed"], retimed.busy(), retimed.alone_bound):
        assert retimed.cpu_wait_share is not None  # busy: its share was read
        inconclusive(
            result,
            [f"candidate: {line}; its calls made alone drew no bound"],
            [retimed.cpu_wait_share],
            case,
            spec_index,
        )
    elif label["confirmed"]:
        result["warnings"].append(f"candidate: {line}")
        record(result, "flags", "implausible_speedup", f"candidate: {line}", case, spec_index)
    else:
        fail(result, "timer_integrity", f"candidate: {line}", case, spec_index)


def roofline(torch, device: str, summary: dict, min_bytes: int, expected) -> tuple[str, str] | None:
    """`roofline_floor` for one role's median, on this GPU (nothing on the CPU or an unknown
    device). What the L2 may hold is allowed for: in graph mode (warm L2, calls back to
    back) up to its size of inputs and outputs; with events (the L2 flushed with clean
    lines before each call) the outputs, which a call may leave in the L2 unwritten."""
    if device == "cpu" or not min_bytes:
        return None
    from magpie.roofline.specs import detect_current

    arch = detect_current()
    if arch is None:
        return None
    l2 = int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) or 0)
    warm = any(info.get("mode") != "events" for info in summary.get("rounds_info") or [])
    outputs = sum(x.numel() * x.element_size() for x in as_tuple(expected) if torch.is_tensor(x))
    return roofline_floor(
        summary["median_us"],
        min_bytes,
        arch.memory_tbps,
        arch.name,
        cached_bytes=l2 if warm else min(outputs, l2),
        measured=bool(arch.measured),
    )
