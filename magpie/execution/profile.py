"""The profile action: hardware counters of one implementation from outside its process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from magpie import sandbox
from magpie.execution.actions import with_library, workspace_of
from magpie.harness.evaluate import code_reads, compiler_caches
from magpie.paths import subprocess_env
from magpie.supervision import device_lock
from magpie.supervision import scratch as scratch_folders

NCU_TIMEOUT_S = 900


def _request(job, work: Path) -> Path:
    spec = job.spec
    request = {"root": spec.params["root"], "kernel": spec.kernel, "impl": with_library(job, spec.params["impl"]),
               "settings": spec.params["settings"], "reps": 1}
    path = work / "request.json"
    path.write_text(json.dumps(request))
    return path


def _sandboxed(job, work: Path, profiler: list[str], policy: sandbox.Policy | None) -> list[str]:
    """The profiler and the process it starts (the implementation's code) run in the sandbox
    together: a profiler injects threads into what it starts, and a process with threads can
    no longer enter namespaces. They get a private /tmp (profilers keep their locks there)
    and network sockets (their injected library talks to them over local ones); the report's
    isolation says so."""
    request = _request(job, work)
    return sandbox.command([*profiler, sys.executable, "-m", "magpie.harness.profile", str(request)], policy)


def _policy(job, work: Path) -> sandbox.Policy | None:
    spec = job.spec
    root = Path(spec.params["root"])
    impl = with_library(job, spec.params["impl"])
    read = code_reads(root, impl, root / (impl.get("working_dir") or "."))
    return None if sandbox.trusted() else sandbox.Policy(
        write=[str(work), "/tmp"], read=read, hide=workspace_of(job), gpu=True, network=True)


def _private_caches(work: Path) -> dict[str, str]:
    """The profiled process's temporary folder and compiler caches, in its own folder (the only
    place it may write): it compiles what it runs once more, outside the measured range."""
    return {"TMPDIR": str(work), "TRITON_HOME": str(work), **compiler_caches(work)}


def profile(job, out_dir: Path) -> dict:
    spec = job.spec
    correct = job.dep_results.get(f"correctness:{spec.kernel}/{spec.impl}", {})
    if correct.get("correctness_state") != "SUCCESS":
        return {"state": "SKIPPED", "kernels": [], "errors": ["not profiled: the implementation is not correct"]}
    tool = _ncu if shutil.which("ncu") else _rocprof if shutil.which("rocprofv3") else None
    if tool is not None:
        with device_lock.exclusive(spec.params["settings"]["project"]["device"]):
            return tool(job, out_dir)
    return {"state": "SKIPPED", "kernels": [],
            "errors": ["ncu not found: install Nsight Compute (rocprofv3 on ROCm) or drop the rule 'profile'"]}


def _ncu(job, out_dir: Path) -> dict:
    from magpie.graph.fingerprint import gpu_description
    from magpie.roofline.ncu import BASIC, NcuParseError, kernel_roofline, metrics, parse_raw_csv
    from magpie.roofline.specs import lookup

    work = scratch_folders.make("ncu-")
    policy = _policy(job, work)
    try:
        for metric_set in (metrics(), list(BASIC)):  # a chip without some counters still gets the basics
            command = _sandboxed(job, work, [
                "ncu", "--csv", "--page", "raw", "--clock-control", "none", "--target-processes", "all", "--nvtx",
                "--nvtx-include", "magpie_profile/", "--metrics", ",".join(metric_set)], policy)
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=NCU_TIMEOUT_S,
                                      env=subprocess_env({**os.environ, **_private_caches(work)}))
            except subprocess.TimeoutExpired:
                return {"state": "FAILED", "kernels": [], "errors": [f"ncu timeout after {NCU_TIMEOUT_S} s"]}
            if '"ID"' in proc.stdout:
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out_dir / "ncu.csv").write_text(proc.stdout)
    (out_dir / "ncu.log").write_text(proc.stderr)
    try:
        kernels = parse_raw_csv(proc.stdout)
    except NcuParseError as err:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[:500]
        return {"state": "FAILED", "kernels": [], "errors": [f"ncu exited {proc.returncode}: {err}: {tail}"]}
    gpu = gpu_description()
    arch = lookup(gpu[0]) if gpu else None
    rows = [kernel_roofline(k, arch) for k in kernels]
    return {"state": "SUCCESS", "tool": "ncu", "isolation": sandbox.describe(policy), "arch": arch.name if arch else None,
            "peaks_source": (arch.source if arch and not arch.measured else "magpie calibrate") if arch else None,
            "kernels": rows, "total_duration_us": sum(r["duration_us"] for r in rows), "errors": []}


def _rocprof(job, out_dir: Path) -> dict:
    """rocprofv3 kernel trace (durations) and FETCH_SIZE/WRITE_SIZE counters; unverified on AMD hardware."""
    from magpie.roofline.rocprof import parse_rocprof

    with tempfile.TemporaryDirectory(prefix="magpie-rocprof-") as tmp:
        outdir = Path(tmp) / "out"
        policy = _policy(job, Path(tmp))
        command = _sandboxed(job, Path(tmp), ["rocprofv3", "--kernel-trace", "--pmc", "FETCH_SIZE", "WRITE_SIZE",
                                              "--output-format", "csv", "-d", str(outdir), "--"], policy)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=NCU_TIMEOUT_S,
                                  env=subprocess_env({**os.environ, **_private_caches(Path(tmp))}))
        except subprocess.TimeoutExpired:
            return {"state": "FAILED", "kernels": [], "errors": [f"rocprofv3 timeout after {NCU_TIMEOUT_S} s"]}
        traces = {p.name: p.read_text() for p in outdir.rglob("*.csv")}
    for name, text in traces.items():
        (out_dir / name).write_text(text)
    if not traces:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[:500]
        return {"state": "FAILED", "kernels": [],
                "errors": [f"rocprofv3 wrote no CSV (exit {proc.returncode}): {tail}"]}
    rows = parse_rocprof(traces)
    return {"state": "SUCCESS", "tool": "rocprofv3", "isolation": sandbox.describe(policy), "kernels": rows,
            "total_duration_us": sum(r["duration_us"] for r in rows), "errors": []}
