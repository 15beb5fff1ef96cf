"""Profiled (diagnostic) runs: a torch profiler window over the served requests, traces into `torch_trace/`.

A run with `profiler` on is `run_kind: diagnostic` and never `reward_eligible` (the profiler perturbs
latency); a clean `measurement` run is a separate run. How each engine is profiled:

- vllm: `VLLM_TORCH_PROFILER_DIR=<workspace>/torch_trace` in the server's environment, then
  `POST /start_profile` before the load and `POST /stop_profile` after it (vLLM's documented profiler
  routes). sglang: the same with `SGLANG_TORCH_PROFILER_DIR`. Both unverified here (neither engine is
  installed on our machines): the environment and the requests are unit-tested, not the engines.
- transformers (`transformers serve` has no profiler route): the server is started through
  `python -m magpie.serving.torch_launcher -- <its command>`, which runs the same CLI in its own
  process and follows the processes it starts (transformers 5.25 runs the model in a child process):
  SIGUSR1 opens a `torch.profiler.profile` window (CPU, and CUDA where available) in the processes
  that run the model, SIGUSR2 closes it and each writes its Chrome trace to `$MAGPIE_TORCH_TRACE_DIR`
  (the workspace's `torch_trace/`) under a temporary name, then renames it, so a finished file is a
  whole trace. `<pid>.recording` there marks a process whose window is open: the start waits for the
  launcher's, the stop until none is left.
- atom, external: no profiler mechanism; a profiled run is refused before anything starts.

A profile in which no trace holds a model op (`missing_model_ops`: a matmul or attention op or kernel,
or a CUDA graph replay) fails the run with one line: the profiler missed the process that runs the model.

After the load the traces are analysed by `magpie.traces.report.analyze_traces` in inference mode
into the workspace (`tracelens/`, `gap_analysis/`, `gpu_timeline.csv`, `trace_report.html`), and
the report's `tracelens_analysis`, `gap_analysis`, `kernel_summary` and `top_bottlenecks` are filled.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import msgspec

from magpie.environment import TORCH_TRACE_DIR

TRACE_DIR = "torch_trace"
ENDPOINT_ENGINES = {"vllm": "VLLM_TORCH_PROFILER_DIR", "sglang": "SGLANG_TORCH_PROFILER_DIR"}
LAUNCHER_ENGINES = ("transformers",)
START_SIGNAL, STOP_SIGNAL = signal.SIGUSR1, signal.SIGUSR2
MARKER_SUFFIX = ".recording"


class ProfilerError(RuntimeError):
    """The profiler could not be started or stopped, or wrote no trace."""


def supported(engine_name: str) -> bool:
    return engine_name in ENDPOINT_ENGINES or engine_name in LAUNCHER_ENGINES


def environment(engine_name: str, trace_dir: Path) -> dict[str, str]:
    """Variables that point the engine's profiler at `trace_dir`."""
    if engine_name in ENDPOINT_ENGINES:
        return {ENDPOINT_ENGINES[engine_name]: str(trace_dir)}
    if engine_name in LAUNCHER_ENGINES:
        return {TORCH_TRACE_DIR: str(trace_dir)}
    raise ProfilerError(f"the {engine_name} engine has no profiler mechanism here (vllm, sglang, transformers)")


def command(engine_name: str, command: list[str]) -> list[str]:
    """The server's command line, wrapped in the launcher where the engine has no profiler route."""
    if engine_name in LAUNCHER_ENGINES:
        return [sys.executable, "-m", "magpie.serving.torch_launcher", "--", *command]
    return list(command)


def post(base_url: str, route: str, timeout: float = 60.0) -> int:
    """POST to `route`; its HTTP status (raises ProfilerError when the server cannot be reached)."""
    req = urllib.request.Request(
        base_url.rstrip("/") + route, data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        raise ProfilerError(f"{route} answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ProfilerError(f"{route}: {exc}") from None


def traces(trace_dir: Path) -> list[Path]:
    return (
        sorted(p for p in trace_dir.rglob("*") if p.name.endswith((".json", ".json.gz"))) if trace_dir.is_dir() else []
    )


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:  # the server is gone (or not ours)
        raise ProfilerError(f"cannot signal the server (pid {pid}): {exc.strerror or exc}") from None


def _open_windows(trace_dir: Path) -> list[Path]:
    return sorted(trace_dir.glob(f"*{MARKER_SUFFIX}")) if trace_dir.is_dir() else []


def start(engine_name: str, base_url: str, pid: int | None, trace_dir: Path, wait_s: float = 60.0) -> None:
    """Opens the window; for the launcher, waits until it says every process it follows records."""
    if engine_name in ENDPOINT_ENGINES:
        post(base_url, "/start_profile")
        return
    if pid is None:
        return
    _signal(pid, START_SIGNAL)
    marker = trace_dir / f"{pid}{MARKER_SUFFIX}"
    deadline = time.monotonic() + wait_s
    while not marker.exists():
        if time.monotonic() >= deadline:
            raise ProfilerError(
                f"the server (pid {pid}) did not open its profiler window within {wait_s:g} s "
                f"(no {marker.name} in {trace_dir}; its log says why)"
            )
        _signal(pid, 0)  # still there
        time.sleep(0.05)


def stop(engine_name: str, base_url: str, pid: int | None, trace_dir: Path, wait_s: float = 120.0) -> list[Path]:
    """Stops the window and waits until no process still records, a trace file is there and none grows;
    the traces."""
    if engine_name in ENDPOINT_ENGINES:
        post(base_url, "/stop_profile", timeout=max(wait_s, 1.0))
    elif pid is not None:
        _signal(pid, STOP_SIGNAL)
    deadline = time.monotonic() + wait_s
    last = None
    while time.monotonic() < deadline:
        found = traces(trace_dir)
        sizes = [(p, p.stat().st_size) for p in found if p.exists()]
        if sizes and sizes == last and not _open_windows(trace_dir):
            return found
        last = sizes
        time.sleep(0.5)
    still_open = _open_windows(trace_dir)
    if still_open:
        raise ProfilerError(
            f"process(es) {', '.join(p.name.removesuffix(MARKER_SUFFIX) for p in still_open)} "
            f"wrote no trace within {wait_s:g} s of the profiler's stop"
        )
    raise ProfilerError(f"no finished trace in {trace_dir} within {wait_s:g} s of the profiler's stop")


# A GEMM or attention op as the CPU side records it (ATen, or an engine's custom attention op)
_MODEL_CPU_OP = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|_int_mm)$|attention|attn", re.I)
_GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch")


class _Event(msgspec.Struct):
    name: str = ""
    cat: str | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []


def missing_model_ops(paths: list[Path]) -> str | None:
    """None where some trace holds a model op: a matmul or attention op (`aten::mm`, `aten::linear`,
    `aten::scaled_dot_product_attention`, an engine's attention op), a GEMM or attention kernel, or a
    CUDA/HIP graph replay (a captured forward). Else the run's one error line, with what the traces hold.
    A trace that cannot be read counts as holding none (the analysis reports it)."""
    from magpie.traces.kernels import category

    ops: Counter = Counter()
    for path in paths:
        try:
            raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
            events = msgspec.json.decode(raw, type=_Trace).traceEvents
        except (OSError, EOFError, gzip.BadGzipFile, msgspec.DecodeError):
            continue
        for event in events:
            if (
                event.cat == "cpu_op"
                and _MODEL_CPU_OP.search(event.name)
                or event.cat == "kernel"
                and category(event.name) in ("gemm", "attention")
                or event.cat in ("cuda_runtime", "cuda_driver")
                and event.name in _GRAPH_LAUNCHES
            ):
                return None
            if event.cat == "cpu_op":
                ops[event.name] += 1
    held = ", ".join(f"{name} x{n}" for name, n in ops.most_common(3)) or "no op"
    return (
        f"the profile holds no model op (no matmul, attention or graph replay in {len(paths)} trace(s)): "
        f"the profiler did not record the process that runs the model; the traces hold {held}"
    )


def analyse(trace_dir: Path, work: Path, mode: str = "inference") -> dict:
    """The trace analysis (`mode`: inference or pytorch) into `work`; the report's profiling fields."""
    from magpie.serving.report import kernel_rows
    from magpie.traces.report import analyze_traces

    summary = analyze_traces(trace_dir, work, analysis_mode=mode)
    return {
        "tracelens_analysis": summary["tracelens_analysis"],
        "gap_analysis": {
            "top": summary["top"],
            "total_kernel_time_us": summary["total_kernel_time_us"],
            "kernels": sum(t["kernels"] for t in summary["traces"]),
            "explanation": summary["explanation"],
            "warnings": summary["warnings"],
            "errors": summary["errors"],
            "traces": summary["traces"],
            "outputs": summary["outputs"],
        },
        "kernel_summary": kernel_rows(summary["top"]),
        "top_bottlenecks": summary["top"][:10],
    }
