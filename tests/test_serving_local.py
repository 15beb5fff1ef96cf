"""Local run mode with a stand-in engine (tests/fixtures/serving/fake_engine.py, the stub SSE server plus /health)
and external mode against the stub: the report and the files of a good run, and each failure path — engine
exits at start (its log tail in the report), never ready (timeout), port taken, model path wrong, dies during the
run (success false, errors, no process of its group left), the benchmark's timeout, Ctrl-C — each a clear first
error and a written report, with the server's whole process group stopped."""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ctrl_c_taken

from magpie.cli import main
from magpie.serving import engines
from magpie.serving.engines.base import Engine
from magpie.serving.local import free_port, group_alive
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import REPORT, run_benchmark
from magpie.serving.stub_server import ThreadedStubServer

FAKE = Path(__file__).parent / "fixtures" / "serving" / "fake_engine.py"


class Fake(Engine):
    name = "vllm"

    def program(self):
        return [sys.executable, str(FAKE)]

    def _flags(self, spec):
        return ["--host", spec.host, "--port", str(self.port(spec))]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(engines, "get", lambda name: Fake())


def cfg(tmp_path, *args, **kw):
    base = dict(
        framework="vllm",
        model="fake-model",
        port=free_port(),
        input_len=8,
        output_len=5,
        num_prompts=8,
        concurrency=4,
        output_dir=str(tmp_path / "ws"),
        timeout_s=60,
        extra_server_args=list(args),
    )
    base.update(kw)
    return BenchmarkConfig(**base)


def saved(report):
    return json.loads((Path(report.workspace_dir) / REPORT).read_text())


def test_good_run_writes_the_workspace(fake, tmp_path):
    r = run_benchmark(cfg(tmp_path, "--child"))
    assert r.success and r.errors == [] and r.reward_eligible and r.run.completed == 8
    assert r.run.total_output_tokens == 40 and r.latency.ttft.mean > 0
    ws = Path(r.workspace_dir)
    for name in ("benchmark_report.json", "benchmark_config.json", "bench_serve_result.json", "server.log"):
        assert (ws / name).is_file(), name
    vllm = json.loads((ws / "bench_serve_result.json").read_text())
    assert vllm["completed"] == 8 and vllm["total_output_tokens"] == 40 and "p99_ttft_ms" in vllm
    assert saved(r)["success"] is True and "fake engine: child" in (ws / "server.log").read_text()
    assert r.server.exit_code is not None and not group_alive(r.server.pid)
    assert r.provenance.model_hash is None and r.provenance.magpie_version


def test_engine_exits_at_start(fake, tmp_path):
    r = run_benchmark(cfg(tmp_path, "--mode", "crash"))
    assert not r.success and r.errors[0].startswith("the server exited with code 3 before it was ready")
    assert "no weights here" in r.errors[1] and saved(r)["errors"] == r.errors
    assert r.throughput is None and r.latency is None


def test_never_ready_times_out(fake, tmp_path):
    t = time.monotonic()
    r = run_benchmark(cfg(tmp_path, "--mode", "never-ready", "--child", ready_timeout_s=1.5))
    assert time.monotonic() - t < 20
    assert not r.success and "not ready within 1.5 s" in r.errors[0]
    assert not group_alive(r.server.pid)


def test_port_taken(fake, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_benchmark(cfg(tmp_path, port=port))
    assert not r.success and r.errors == [
        f"port {port} on 127.0.0.1 is already taken (another server?); stop it or choose another port"
    ]


def test_model_path_wrong(fake, tmp_path):
    r = run_benchmark(cfg(tmp_path, model=str(tmp_path / "no-such-model")))
    assert not r.success and r.errors == [f"model path not found: {tmp_path / 'no-such-model'}"]
    assert r.server is None


def test_dies_during_the_run(fake, tmp_path):
    r = run_benchmark(
        cfg(tmp_path, "--mode", "die-after", "--n", "4", "--child", "--delay", "0.05", num_prompts=12, concurrency=2)
    )
    assert not r.success and r.server.died_during_run and r.server.exit_code == 7
    assert r.errors[0].startswith("the server exited with code 7 during the run")
    assert any("requests failed" in e for e in r.errors) and r.run.failed > 0
    assert any("dying after 4" in e for e in r.errors)
    assert not group_alive(r.server.pid)
    assert saved(r)["success"] is False


def test_benchmark_timeout(fake, tmp_path):
    r = run_benchmark(cfg(tmp_path, "--delay", "0.5", timeout_s=4, output_len=50))
    assert not r.success and "timeout of 4 s passed during the load" in r.errors[0]
    assert not group_alive(r.server.pid)


def test_ctrl_c_stops_the_group(tmp_path):
    port = free_port()
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from magpie.serving import engines
import test_serving_local as t
engines.get = lambda name: t.Fake()
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import run_benchmark
run_benchmark(BenchmarkConfig(framework="vllm", model="m", port={port}, output_dir={str(tmp_path / "ws")!r},
    extra_server_args=["--delay", "0.5", "--child"], output_len=200, num_prompts=4, timeout_s=120))
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_taken)
    log = tmp_path / "ws" / "server.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "listening" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    report = json.loads((tmp_path / "ws" / REPORT).read_text())
    assert report["success"] is False and report["errors"][0].startswith("interrupted")
    assert not group_alive(report["server"]["pid"])


def test_cli_external_against_the_stub(tmp_path, capsys):
    with ThreadedStubServer() as srv:
        rc = main(
            [
                "benchmark",
                "vllm",
                "-m",
                "tiny",
                "--base-url",
                srv.base_url,
                "--num-prompts",
                "5",
                "--input-len",
                "4",
                "--output-len",
                "3",
                "--concurrency",
                "2",
                "-o",
                str(tmp_path),
            ]
        )
    assert rc == 0
    out = capsys.readouterr().out
    assert "vllm tiny: 5 requests" in out and "written:" in out
    report = json.loads((tmp_path / REPORT).read_text())
    assert report["success"] and report["server"]["mode"] == "external" and report["framework"] == "vllm"
    assert report["throughput"]["output_throughput"] > 0


def test_cli_errors(tmp_path, capsys):
    assert main(["benchmark", "external", "-m", "m", "-o", str(tmp_path)]) == 1
    assert "give --base-url URL" in capsys.readouterr().err
    assert main(["benchmark", "-m", "m"]) == 2
    assert "name the engine first" in capsys.readouterr().err
    assert main(["benchmark", "vllm", "-m", "m", "--concurrency", "0", "-o", str(tmp_path)]) == 2
    assert "concurrency" in capsys.readouterr().err
    assert main(["benchmark"]) == 2
    assert "--trace-dir" in capsys.readouterr().err
