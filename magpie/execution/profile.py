"""The profile action: hardware counters of one implementation from outside its process.

Bounded three ways (`[defaults.profile]`): ncu profiles the first launches of each distinct
kernel and a number in all (roofline/ncu.py says how), asks only for the counters the roofline
uses, and is stopped after a timeout derived from the implementation's measured time. The rule
runs after every timing of the build, holding the device alone while ncu replays. A profile
never fails its task: whatever goes wrong is a FAILED result, a warning on its comparison row.

A kernel judged only by testcase commands has no Python spec to call the implementation with:
its first command is profiled instead, and the kernels it launched are reported with their
durations as profiler time (`profiler_time`), not as a timed measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from magpie import environment, sandbox
from magpie.execution.actions import with_library, workspace_of
from magpie.harness.compiler_caches import compiler_caches
from magpie.harness.keys import code_reads
from magpie.harness.profile import RANGE
from magpie.paths import subprocess_env
from magpie.supervision import device_lock
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.process import run_tree

# The timeout of one profile: start-up + the first call again (its caches are empty) + the calls
# outside ncu's replays + per profiled launch, ncu's own set-up and its replays of the kernel.
# Each replay pass takes at most the implementation's measured time per call (a launch is part of
# a call), so a slow implementation gets a longer timeout, a fast one a short one; never under the
# floor, never over the project's max_timeout_s.
STARTUP_S = 60.0  # ncu, the interpreter, torch, a CUDA context, the inputs and the reference
FIRST_CALL_FACTOR = 3.0  # the first call of a correctness worker (JIT, autotuning), from empty caches, under ncu
CALLS = 10  # calls outside the replays (warm-up, the profiled call, the reference), at the measured time each
PER_LAUNCH_S = 1.5  # ncu's set-up per profiled launch: saving and restoring memory, SASS patching
REPLAY_PASSES = 40  # replay passes per profiled launch (the instruction counters need several)
COMMAND_LAUNCH_S = 0.05  # a command's launches are not timed beforehand: this much each, per pass
FLOOR_S = 120.0
PROFILER_TIME_METHOD = (
    "ncu gpu__time_duration of the testcase command's kernels (profiler time, not a timed measurement)"
)
# Kernels a timing saw that are no kernels to ncu (copies and fills by the driver).
NOT_KERNELS = ("Memcpy", "Memset")


def profile_timeout(
    bounds: dict, *, call_s: float, launches: int, first_call_s: float = 0.0, fixed_s: float = 0.0
) -> tuple[float, dict]:
    """Seconds ncu may take, and how they were reckoned (recorded in the result)."""
    per_launch = PER_LAUNCH_S + REPLAY_PASSES * call_s
    reckoned = STARTUP_S + FIRST_CALL_FACTOR * first_call_s + fixed_s + CALLS * call_s + launches * per_launch
    timeout = min(max(reckoned, FLOOR_S), float(bounds["max_timeout_s"]))
    basis = {
        "startup_s": STARTUP_S,
        "first_call_s": round(first_call_s, 3),
        "fixed_s": round(fixed_s, 3),
        "call_s": call_s,
        "launches": launches,
        "per_launch_s": round(per_launch, 3),
        "reckoned_s": round(reckoned, 1),
        "floor_s": FLOOR_S,
        "ceiling_s": float(bounds["max_timeout_s"]),
    }
    return round(timeout, 1), basis


@dataclass
class Target:
    """What ncu starts, sandboxed, and what the profile knows of it beforehand."""

    argv: list[str]
    cwd: str
    env: dict
    policy: sandbox.Policy | None
    timeout_s: float
    timeout_basis: dict
    nvtx_range: str | None  # only kernels inside it (a Python implementation); none for a command
    expects_kernels: bool | None  # its timing saw kernels (None: not known)
    extra: dict = field(default_factory=dict)  # recorded in the result


def profile(job, out_dir: Path) -> dict:
    spec = job.spec
    try:
        correct = job.dep_results.get(f"correctness:{spec.kernel}/{spec.impl}", {})
        if correct.get("correctness_state") != "SUCCESS":
            return _result("SKIPPED", errors=["not profiled: the implementation is not correct"])
        tool = _ncu if shutil.which("ncu") else _rocprof if shutil.which("rocprofv3") else None
        if tool is None:
            return _result(
                "SKIPPED",
                errors=["ncu not found: install Nsight Compute (rocprofv3 on ROCm) or drop the rule 'profile'"],
            )
        with device_lock.exclusive(spec.params["settings"]["project"]["device"]):
            return tool(job, out_dir)
    except Exception as err:  # a profile is a warning on its row, never a lost comparison
        return _result("FAILED", errors=[f"profile: {type(err).__name__}: {err}"])


def _result(state: str, **fields) -> dict:
    return {"state": state, "kernels": [], "errors": [], **fields}


def bounds_of(job) -> dict:
    from magpie.manifest.models import ProfileSettings

    return {**ProfileSettings().model_dump(), **(job.spec.params["settings"].get("profile") or {})}


def _command_testcase(settings: dict) -> tuple[int, dict] | None:
    """The first command testcase of a kernel that has no Python spec testcase, else None."""
    testcases = settings["correctness"]["testcases"]
    if any(tc.get("spec") for tc in testcases):
        return None
    return next(((i, tc) for i, tc in enumerate(testcases) if tc.get("command")), None)


def _timed_kernels(timing: dict) -> bool | None:
    """Whether the implementation's timing saw kernels run (None: it does not say)."""
    perf = timing.get("performance_result") or {}
    names = perf.get("kernels")
    if not isinstance(names, dict):
        return None
    return any(not str(name).startswith(NOT_KERNELS) for name in names)


def _first_call_s(correct: dict) -> float:
    steps = [s.get("first_call", 0.0) for s in correct.get("worker_steps_s") or [] if s]
    return max(steps, default=0.0)


def implementation_target(job, work: Path, bounds: dict, profiler_start: bool = True) -> Target:
    """The profiled process (`magpie.harness.profile`): one call of the implementation, on the
    spec's largest case, inside the NVTX range, after a warm-up call outside it."""
    spec = job.spec
    root = Path(spec.params["root"])
    impl = with_library(job, spec.params["impl"])
    timing = job.dep_results.get(f"timing:{spec.kernel}/{spec.impl}", {})
    minors = timing.get("gpu_minors")
    # a sandbox that opens one GPU's node shows CUDA that GPU alone, as its device 0
    request = {
        "root": str(root),
        "kernel": spec.kernel,
        "impl": impl,
        "settings": spec.params["settings"],
        "reps": 1,
        "profiler_start": profiler_start,
        "device": "cuda:0" if minors else None,
    }
    (work / "request.json").write_text(json.dumps(request))
    median_us = ((timing.get("performance_result") or {}).get("median_us")) or 0.0
    correct = job.dep_results.get(f"correctness:{spec.kernel}/{spec.impl}", {})
    timeout, basis = profile_timeout(
        bounds, call_s=median_us / 1e6, launches=int(bounds["max_launches"]), first_call_s=_first_call_s(correct)
    )
    basis["median_us"] = median_us
    policy = (
        None
        if sandbox.trusted()
        else sandbox.Policy(
            write=[str(work), "/tmp"],
            read=code_reads(root, impl, root / (impl.get("working_dir") or ".")),
            hide=workspace_of(job),
            gpu=True,
            network=True,
            gpu_minors=minors,
        )
    )
    return Target(
        argv=[sys.executable, "-m", "magpie.harness.profile", str(work / "request.json")],
        cwd=os.getcwd(),
        env=subprocess_env({**os.environ, **_private_caches(work)}),
        policy=policy,
        timeout_s=timeout,
        timeout_basis=basis,
        nvtx_range=RANGE,
        expects_kernels=_timed_kernels(timing),
    )


def command_target(job, work: Path, bounds: dict, index: int, testcase: dict) -> Target:
    """A command testcase run as its correctness job ran it (its environment, folder and
    sandbox), under ncu: every kernel of every process it starts, within the launch cap."""
    spec = job.spec
    root = Path(spec.params["root"])
    impl = with_library(job, spec.params["impl"])
    cwd = root / (testcase.get("working_dir") or ".")
    env = subprocess_env(
        {
            **os.environ,
            **(impl.get("env") or {}),
            **(testcase.get("env") or {}),
            **_private_caches(work),
            environment.IMPL_ID: impl["id"],
            environment.IMPL_SOURCE: str(root / impl["source"]),
        }
    )
    correct = job.dep_results.get(f"correctness:{spec.kernel}/{spec.impl}", {})
    ran: dict = next(
        (c for c in correct.get("checks") or [] if c.get("testcase") == index and c.get("case") == "command"), {}
    )
    wall_s = float(ran.get("wall_s") or 0.0)
    timeout, basis = profile_timeout(
        bounds, call_s=COMMAND_LAUNCH_S, launches=int(bounds["max_launches"]), fixed_s=3 * wall_s
    )
    basis["command_wall_s"] = round(wall_s, 3)
    policy = (
        None
        if sandbox.trusted()
        else sandbox.Policy(
            write=[str(work), "/tmp"],
            read=code_reads(root, impl, cwd),
            hide=workspace_of(job),
            gpu=True,
            network=True,
            gpu_minors=correct.get("gpu_minors"),
        )
    )
    return Target(
        argv=["/bin/sh", "-c", testcase["command"]],
        cwd=str(cwd),
        env=env,
        policy=policy,
        timeout_s=timeout,
        timeout_basis=basis,
        nvtx_range=None,
        expects_kernels=None,
        extra={"testcase": index, "command": testcase["command"]},
    )


def _private_caches(work: Path) -> dict[str, str]:
    """The profiled process's temporary folder and compiler caches, in its own folder (the only
    place it may write): it compiles what it runs once more, outside the measured range."""
    return {"TMPDIR": str(work), "TRITON_HOME": str(work), **compiler_caches(work)}


@dataclass
class NcuRun:
    """ncu's last run for a profile, and what was tried before it."""

    proc: subprocess.CompletedProcess
    outcome: str  # profiled, nothing profiled, error
    mode: str  # the launch cap's filter (roofline/ncu.py)
    metric_set: list[str]
    attempts: list[dict]
    notes: list[str]


def _run_ncu(target: Target, per_kernel: int, total: int) -> NcuRun:
    """ncu around the target until it profiles (or finds nothing to profile), within the
    target's timeout in all: on an error, with the basic counters (a chip without some of the
    others), then with the per-launch-config cap (an ncu whose --kernel-id takes no regex); where
    --kernel-id profiled nothing although the timing saw kernels, with the per-launch-config cap.
    Raises subprocess.TimeoutExpired once the timeout has passed."""
    from magpie.roofline.ncu import BASIC, KERNEL_ID, PER_LAUNCH_CONFIG, metrics, ncu_command, profiled_nothing

    deadline = time.monotonic() + target.timeout_s
    metric_sets = (metrics(), list(BASIC))
    mode, which, attempts, notes = KERNEL_ID, 0, [], []
    while True:
        argv = ncu_command(metric_sets[which], per_kernel, total, mode, target.nvtx_range)
        started = time.monotonic()
        proc = run_tree(
            sandbox.command([*argv, *target.argv], target.policy),
            cwd=target.cwd,
            env=target.env,
            text=True,
            timeout=max(deadline - started, 1.0),
        )
        outcome = (
            "profiled"
            if '"ID"' in proc.stdout
            else "nothing profiled"
            if profiled_nothing(proc.stdout, proc.stderr)
            else "error"
        )
        attempts.append(
            {
                "filter": mode,
                "metrics": "roofline" if which == 0 else "basic",
                "exit": proc.returncode,
                "outcome": outcome,
                "wall_s": round(time.monotonic() - started, 3),
            }
        )
        if outcome == "nothing profiled" and mode == KERNEL_ID and target.expects_kernels:
            notes.append(
                "--kernel-id profiled no kernel although the timing saw kernels run: "
                "profiled again with --filter-mode per-launch-config"
            )
            mode = PER_LAUNCH_CONFIG
        elif outcome == "error" and which + 1 < len(metric_sets):
            which += 1
        elif outcome == "error" and mode == KERNEL_ID:
            mode, which = PER_LAUNCH_CONFIG, 0
        else:
            return NcuRun(proc, outcome, mode, metric_sets[which], attempts, notes)


def _ncu(job, out_dir: Path) -> dict:
    from magpie.graph.fingerprint import gpu_description
    from magpie.roofline.ncu import KERNEL_ID, NcuParseError, kernel_roofline, parse_raw_csv
    from magpie.roofline.specs import lookup

    bounds = bounds_of(job)
    per_kernel, total = int(bounds["launches_per_kernel"]), int(bounds["max_launches"])
    work = scratch_folders.make("ncu-")
    try:
        command = _command_testcase(job.spec.params["settings"])
        target = command_target(job, work, bounds, *command) if command else implementation_target(job, work, bounds)
        known = {
            "tool": "ncu",
            "isolation": sandbox.describe(target.policy),
            "timeout_s": target.timeout_s,
            "timeout_basis": target.timeout_basis,
            **target.extra,
        }
        try:
            run = _run_ncu(target, per_kernel, total)
        except subprocess.TimeoutExpired:
            return _result(
                "FAILED",
                **known,
                errors=[
                    f"ncu timeout after {target.timeout_s:g} s (derived from its measured time; "
                    f"[defaults.profile] max_timeout_s caps it)"
                ],
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out_dir / "ncu.csv").write_text(run.proc.stdout)
    (out_dir / "ncu.log").write_text(run.proc.stderr)
    common = {
        **known,
        "launch_cap": {"per_kernel": per_kernel, "total": total if run.mode == KERNEL_ID else None, "filter": run.mode},
        "metrics": run.metric_set,
        "attempts": run.attempts,
    }
    if run.outcome == "nothing profiled":
        where = " of the testcase command" if target.nvtx_range is None else " (a copy such as x.clone() is a memcpy)"
        return _result(
            "SUCCESS",
            **common,
            total_duration_us=0.0,
            notes=[*run.notes, f"no kernel ran in the profiled range{where}"],
        )
    try:
        kernels = parse_raw_csv(run.proc.stdout)
    except NcuParseError as err:
        tail = " | ".join(run.proc.stderr.strip().splitlines()[-3:])[:500]
        return _result("FAILED", **common, errors=[f"ncu exited {run.proc.returncode}: {err}: {tail}"])
    gpu = gpu_description()
    arch = lookup(gpu[0]) if gpu else None
    rows = [kernel_roofline(k, arch) for k in kernels]
    result = _result(
        "SUCCESS",
        **common,
        arch=arch.name if arch else None,
        peaks_source=(arch.source if not arch.measured else "magpie calibrate") if arch else None,
        kernels=rows,
        total_duration_us=sum(r["duration_us"] for r in rows),
        notes=run.notes,
    )
    if target.nvtx_range is None:
        result["profiler_time"] = profiler_time(rows)
    return result


def profiler_time(rows: list[dict]) -> dict:
    """A command's kernels as profiler time: what ncu measured of each launch it profiled (under
    its replays, clocks as they were), labelled so; not comparable with a timed median."""
    return {
        "method": PROFILER_TIME_METHOD,
        "kernel_us": sum(r["duration_us"] for r in rows),
        "launches": len(rows),
        "kernels": sorted({r["name"] for r in rows}),
    }


def _rocprof(job, out_dir: Path) -> dict:
    """rocprofv3 kernel trace (durations) and FETCH_SIZE/WRITE_SIZE counters; unverified on AMD hardware."""
    from magpie.roofline.rocprof import parse_rocprof

    if _command_testcase(job.spec.params["settings"]):
        return _result(
            "SKIPPED", errors=["not profiled: a kernel judged by testcase commands is profiled with ncu only"]
        )
    bounds = bounds_of(job)
    with tempfile.TemporaryDirectory(prefix="magpie-rocprof-") as tmp:
        outdir = Path(tmp) / "out"
        target = implementation_target(job, Path(tmp), bounds, profiler_start=False)
        command = sandbox.command(
            [
                "rocprofv3",
                "--kernel-trace",
                "--pmc",
                "FETCH_SIZE",
                "WRITE_SIZE",
                "--output-format",
                "csv",
                "-d",
                str(outdir),
                "--",
                *target.argv,
            ],
            target.policy,
        )
        try:
            proc = run_tree(command, text=True, timeout=target.timeout_s, env=target.env, cwd=target.cwd)
        except subprocess.TimeoutExpired:
            return _result("FAILED", errors=[f"rocprofv3 timeout after {target.timeout_s:g} s"])
        traces = {p.name: p.read_text() for p in outdir.rglob("*.csv")}
    for name, text in traces.items():
        (out_dir / name).write_text(text)
    if not traces:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[:500]
        return _result("FAILED", errors=[f"rocprofv3 wrote no CSV (exit {proc.returncode}): {tail}"])
    rows = parse_rocprof(traces)
    return _result(
        "SUCCESS",
        tool="rocprofv3",
        isolation=sandbox.describe(target.policy),
        kernels=rows,
        timeout_s=target.timeout_s,
        total_duration_us=sum(r["duration_us"] for r in rows),
    )
