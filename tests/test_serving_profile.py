"""Profiled serving runs (requirement 4): `--torch-profiler` / `profiler: true` make a run diagnostic (never
reward-eligible); vllm and sglang are profiled through their documented routes and environment (unverified: the
requests and variables are tested against a recording server here, not the engines); `transformers serve` through
magpie's torch launcher, which follows the server's child processes (transformers 5.25 runs the model in one), end to
end on the CPU with the tiny offline model: the trace of the model's ops lands in torch_trace/, the trace analysis
reads it in inference mode and says that a CPU trace has no GPU kernels; a profile without model ops is one error
line."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from magpie import environment
from magpie.cli import main
from magpie.serving import profiling
from magpie.serving.bench_config import load_benchmark_config
from magpie.serving.engines import ServerSpec, get
from magpie.serving.local import free_port, group_alive
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import REPORT, run_benchmark


def test_a_profiled_config_is_diagnostic():
    assert BenchmarkConfig(framework="vllm", model="m", profiler=True).run_kind == "diagnostic"
    assert BenchmarkConfig(framework="vllm", model="m", profiler=True, run_kind="measurement").run_kind == "diagnostic"
    assert BenchmarkConfig(framework="vllm", model="m").run_kind == "measurement"


@pytest.mark.parametrize("value", ["true", "{enabled: true}"])
def test_yaml_profiler_true_is_accepted_and_diagnostic(tmp_path, value):
    path = tmp_path / "bench.yaml"
    path.write_text(f"benchmark: {{framework: vllm, model: m, profiler: {value}}}\n")
    config = load_benchmark_config(path)
    assert config.profiler and config.run_kind == "diagnostic"


@pytest.mark.parametrize(
    "engine, variable", [("vllm", "VLLM_TORCH_PROFILER_DIR"), ("sglang", "SGLANG_TORCH_PROFILER_DIR")]
)
def test_endpoint_engines_get_their_profiler_dir_and_unchanged_command(tmp_path, engine, variable):
    assert profiling.environment(engine, tmp_path / "torch_trace") == {variable: str(tmp_path / "torch_trace")}
    command = get(engine).command(ServerSpec(model="m"))
    assert profiling.command(engine, command) == command


def test_transformers_runs_under_the_launcher(tmp_path):
    command = get("transformers").command(ServerSpec(model="m"))
    wrapped = profiling.command("transformers", command)
    assert wrapped[1:4] == ["-m", "magpie.serving.torch_launcher", "--"] and wrapped[4:] == command
    assert profiling.environment("transformers", tmp_path) == {environment.TORCH_TRACE_DIR: str(tmp_path)}
    with pytest.raises(profiling.ProfilerError, match="no profiler mechanism"):
        profiling.environment("atom", tmp_path)


class _Recorder(BaseHTTPRequestHandler):
    """vLLM's profiler routes as documented: POST /start_profile, POST /stop_profile (the trace is then written)."""

    paths: list = []
    trace_dir: Path = Path(".")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).paths.append(self.path)
        if self.path == "/stop_profile":
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            (self.trace_dir / "rank0.pt.trace.json").write_text('{"traceEvents": []}')
        self.send_response(200 if self.path in ("/start_profile", "/stop_profile") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_endpoint_engines_start_and_stop_through_their_routes(tmp_path):
    _Recorder.paths, _Recorder.trace_dir = [], tmp_path / "torch_trace"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        profiling.start("vllm", url, None, tmp_path / "torch_trace")
        found = profiling.stop("vllm", url, None, tmp_path / "torch_trace", wait_s=10)
        assert _Recorder.paths == ["/start_profile", "/stop_profile"]
        assert [p.name for p in found] == ["rank0.pt.trace.json"]
        with pytest.raises(profiling.ProfilerError, match="404"):
            profiling.post(url, "/nothing")
    finally:
        server.shutdown()


def test_stop_without_a_trace_is_a_profiler_error(tmp_path):
    with pytest.raises(profiling.ProfilerError, match="no finished trace"):
        profiling.stop("transformers", "http://unused", None, tmp_path / "torch_trace", wait_s=0.6)


def test_stop_while_a_process_still_records_names_it(tmp_path):
    (tmp_path / "4242.recording").write_text("")
    (tmp_path / "host_1.1.pt.trace.json").write_text('{"traceEvents": []}')
    with pytest.raises(profiling.ProfilerError, match=r"process\(es\) 4242 wrote no trace within 1.1 s"):
        profiling.stop("transformers", "http://unused", None, tmp_path, wait_s=1.1)


def test_signalling_a_server_that_is_gone_is_a_profiler_error(tmp_path):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    for call in (
        lambda: profiling.start("transformers", "http://unused", proc.pid, tmp_path),
        lambda: profiling.stop("transformers", "http://unused", proc.pid, tmp_path, wait_s=0.6),
    ):
        with pytest.raises(profiling.ProfilerError, match=f"cannot signal the server \\(pid {proc.pid}\\)"):
            call()


@pytest.mark.parametrize("framework, extra", [("atom", {}), ("vllm", {"base_url": "http://127.0.0.1:9"})])
def test_engines_without_a_mechanism_are_refused_before_anything_starts(tmp_path, framework, extra):
    report = run_benchmark(
        BenchmarkConfig(framework=framework, model="m", profiler=True, output_dir=str(tmp_path / "ws"), **extra)
    )
    assert not report.success and not report.reward_eligible and report.run_kind == "diagnostic"
    assert report.errors[0].startswith(f"--torch-profiler: no profiler mechanism for {framework}")
    assert report.server is None or report.server.pid is None


def test_the_window_opens_after_the_warm_ups_and_before_the_measured_requests():
    import asyncio

    from magpie.serving import load
    from magpie.serving.models import DatasetConfig, LoadConfig
    from magpie.serving.stub_server import Reply, ThreadedStubServer

    with ThreadedStubServer(script=lambda p, b: Reply(tokens=3), record=True) as srv:
        seen = []
        cfg = LoadConfig(
            base_url=srv.base_url,
            model="m",
            num_prompts=3,
            num_warmups=2,
            dataset=DatasetConfig(input_len=4, output_len=3),
        )
        record = asyncio.run(
            load.run(cfg, load.load_samples(cfg), before_measured=lambda: seen.append(len(srv.requests)))
        )
        assert seen == [3]  # the ready check and two warm-ups were sent before it
        assert len(srv.requests) == 6 and len(record.outputs) == 3 and len(record.warmups) == 2


# A server that runs its model in a child process, as transformers 5.25's `transformers serve` does (the main
# process only waits; the child multiplies matrices on its main thread), or, given "thread", on a thread of its own
# process, as transformers did before. Like a server, it is ready (says the pid that runs the model) once the model
# is loaded (torch imported).
_CHILD_MODEL_SERVER = """
import multiprocessing, os, sys, threading, time

def model(stop_after_s):
    import torch
    print(os.getpid(), flush=True)
    weight = torch.full((32, 32), 0.01)
    deadline = time.monotonic() + stop_after_s
    while time.monotonic() < deadline:
        torch.mm(weight, weight)
        time.sleep(0.005)

if __name__ == "__main__":
    if sys.argv[1] == "thread":
        runner = threading.Thread(target=model, args=(120.0,), name="inference")
        runner.start()
        runner.join()
    else:
        child = multiprocessing.get_context(sys.argv[1]).Process(target=model, args=(120.0,), name="model")
        child.start()
        child.join()
"""


@pytest.mark.parametrize("start_method", ["spawn", "fork", "thread"])
def test_the_launcher_records_the_model_in_the_process_that_runs_it(tmp_path, start_method):
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "child_model_server.py").write_text(_CHILD_MODEL_SERVER)
    trace_dir = tmp_path / "torch_trace"
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        environment.TORCH_TRACE_DIR: str(trace_dir),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "magpie.serving.torch_launcher",
            "--",
            sys.executable,
            "-m",
            "child_model_server",
            start_method,
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        model_pid = int(server.stdout.readline())
        # the model's process was born with both signals blocked (so one sent before it takes them waits, and kills
        # nothing); a thread of its own takes them
        blocked = int(
            next(
                line
                for line in Path(f"/proc/{model_pid}/status").read_text().splitlines()
                if line.startswith("SigBlk:")
            ).split()[1],
            16,
        )
        assert all(blocked & (1 << (sig - 1)) for sig in (signal.SIGUSR1, signal.SIGUSR2))
        profiling.start("transformers", "http://unused", server.pid, trace_dir, wait_s=60)
        assert {p.name for p in trace_dir.glob("*.recording")} == {f"{server.pid}.recording", f"{model_pid}.recording"}
        # the stand-in model runs an op every 5 ms; a window closed at once may hold none on a busy machine
        time.sleep(1.0)
        found = profiling.stop("transformers", "http://unused", server.pid, trace_dir, wait_s=60)
        # the process that runs the model wrote the trace; a main process that runs none wrote none
        assert [p.name.split(".")[0].rsplit("_", 1)[1] for p in found] == [str(model_pid)]
        assert not list(trace_dir.glob("*.recording")) and not list(trace_dir.glob("*.tmp"))
        assert profiling.missing_model_ops(found) is None
        names = {e["name"] for e in json.loads(found[0].read_text())["traceEvents"] if e.get("cat") == "cpu_op"}
        assert "aten::mm" in names
        assert server.poll() is None  # the signals ended no process of the server
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its model process
        server.wait()


def _real_trace(path: Path, work) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work(torch)
    prof.export_chrome_trace(str(path))
    return path


def test_a_profile_without_model_ops_is_one_error_line(tmp_path):
    copies = _real_trace(
        tmp_path / "api_server.pt.trace.json", lambda torch: [torch.ones(8).clone().to(torch.float64) for _ in range(5)]
    )
    line = profiling.missing_model_ops([copies])
    assert line is not None and "\n" not in line
    assert line.startswith("the profile holds no model op (no matmul, attention or graph replay in 1 trace(s))")
    assert "the profiler did not record the process that runs the model" in line and "aten::copy_ x10" in line
    model = _real_trace(
        tmp_path / "model.pt.trace.json", lambda torch: torch.nn.functional.linear(torch.ones(4, 8), torch.ones(16, 8))
    )
    assert profiling.missing_model_ops([copies, model]) is None
    attention = _real_trace(
        tmp_path / "attention.pt.trace.json",
        lambda torch: torch.nn.functional.scaled_dot_product_attention(*(torch.ones(1, 2, 4, 8) for _ in range(3))),
    )
    assert profiling.missing_model_ops([attention]) is None


def _profiled_run(model: Path, out: Path, timeout_s: int) -> tuple[int, dict]:
    """`magpie benchmark transformers --torch-profiler` on the model with a small load: its exit code and report."""
    rc = main(
        ["benchmark", "transformers", "-m", str(model), "--port", str(free_port()), "--num-prompts", "4"]
        + ["--concurrency", "2", "--input-len", "16", "--output-len", "8", "--num-warmups", "1"]
        + ["--timeout", str(timeout_s), "--torch-profiler", "-o", str(out)]
    )
    return rc, json.loads((out / REPORT).read_text())


def test_transformers_serve_profiled_end_to_end(tiny_model, tmp_path, capsys):
    out = tmp_path / "ws"
    rc, report = _profiled_run(tiny_model, out, timeout_s=240)
    assert rc == 0, report["errors"]
    assert report["success"] and report["errors"] == []
    assert report["profiling_enabled"] and report["run_kind"] == "diagnostic" and not report["reward_eligible"]
    assert report["run"]["completed"] == 4 and not group_alive(report["server"]["pid"])
    assert report["server"]["command"][1:3] == ["-m", "magpie.serving.torch_launcher"]
    traces = sorted((out / "torch_trace").glob("*.pt.trace.json"))
    assert len(traces) == 1 and not list((out / "torch_trace").glob("*.tmp"))
    assert not list((out / "torch_trace").glob("*.recording"))
    events = json.loads(traces[0].read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    # the model's ops run on the server's inference thread, not the one the signal lands on: all threads recorded
    assert any(e["name"] == "aten::mm" or e["name"] == "aten::addmm" or e["name"] == "aten::linear" for e in ops)
    assert any(e["name"] == "aten::scaled_dot_product_attention" for e in ops)  # the attention, 40.4's other half
    assert len({e["tid"] for e in ops}) >= 2
    # the honest outcome on the CPU: the analysis reads the trace, says it has no GPU kernels, fails nothing
    tl = report["tracelens_analysis"]
    assert tl["analysis_mode"] == "inference" and tl["errors"] == [] and tl["outputs"]
    assert all(Path(p).is_file() for p in tl["outputs"])
    assert all(str(out / "tracelens") in p for p in tl["outputs"])
    gap = report["gap_analysis"]
    assert report["kernel_summary"] == [] and len(gap["traces"]) == 1 and gap["kernels"] == 0
    assert gap["total_kernel_time_us"] == 0
    assert "no GPU kernels in any trace" in gap["explanation"] and "CPU-only profile" in gap["explanation"]
    assert report["top_bottlenecks"] == [] and report["gap_analysis"]["errors"] == []
    assert Path(report["gap_analysis"]["outputs"]["gap_analysis"]).is_file()
    assert (out / "gap_analysis" / "gap_analysis.json").is_file()
    assert "no GPU kernels" in capsys.readouterr().out


@pytest.mark.gpu
def test_transformers_serve_profiled_on_the_gpu_records_the_models_kernels_by_stage(tiny_model, tmp_path):
    """The H200 check of the profiled run: the trace holds the model's GEMM kernels (wherever `transformers
    serve` runs the model: in its own process before 5.25, in a spawned model process since), and the
    inference-mode analysis splits the steps into prefill and decode."""
    from magpie.traces.kernels import category

    out = tmp_path / "ws"
    rc, report = _profiled_run(tiny_model, out, timeout_s=300)
    assert rc == 0 and report["success"], report["errors"]
    traces = sorted((out / "torch_trace").glob("*.pt.trace.json"))
    assert len(traces) == 1 and not list((out / "torch_trace").glob("*.recording"))
    kernels = [e["name"] for e in json.loads(traces[0].read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert any(category(name) == "gemm" for name in kernels), sorted(set(kernels))[:20]
    rows = report["kernel_summary"]  # Magpie's list of the busiest kernels
    assert rows and set(rows[0]) == {"name", "time_ms", "percent", "calls"} and rows[0]["time_ms"] > 0
    tl = report["tracelens_analysis"]
    assert tl["errors"] == [] and tl["per_stage"], tl["warnings"]
    stages = next(iter(tl["per_stage"].values()))
    assert {"prefill", "decode"} <= set(stages), stages.keys()
