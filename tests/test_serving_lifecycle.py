"""Server reuse (magpie/serving/lifecycle.py, Magpie's server_lifecycle) with the stand-in engine
(tests/fixtures/serving/fake_engine.py): a kept server is reused when the recorded config matches and it answers
/health, a mismatching one is stopped and a fresh one started, a recorded server that died is replaced, a failed run
stops its server for good, `--stop-servers` ends them all, and nothing is left running after each test. A server
whose magpie was killed with SIGKILL is stopped by the next run, and one of a live run is left alone."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_serving_local import Fake

from magpie import environment
from magpie.cli import main
from magpie.serving import engines, lifecycle
from magpie.serving.local import free_port, group_alive
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import run_benchmark


@pytest.fixture
def kept(monkeypatch, tmp_path):
    """Records in a folder of the test's own; every server a test kept is stopped, and checked gone, after it."""
    monkeypatch.setattr(engines, "get", lambda name: Fake())
    monkeypatch.setenv(environment.SERVER_DIR, str(tmp_path / "servers"))
    started: list[int] = []
    yield started
    lifecycle.stop_all()
    assert not [pid for pid in started if group_alive(pid)]
    assert not list((tmp_path / "servers").glob("*.json"))


def _run(tmp_path, name, port, *args, **kw):
    config = BenchmarkConfig(
        **{
            **dict(
                framework="vllm",
                model="fake-model",
                port=port,
                input_len=8,
                output_len=4,
                num_prompts=4,
                concurrency=2,
                output_dir=str(tmp_path / name),
                timeout_s=60,
                extra_server_args=list(args),
                server_lifecycle="reuse",
            ),
            **kw,
        }
    )
    return run_benchmark(config)


def _record(tmp_path, port):
    return json.loads((tmp_path / "servers" / f"127.0.0.1_{port}.json").read_text())


def test_a_matching_server_is_reused_and_a_different_one_replaces_it(kept, tmp_path):
    port = free_port()
    first = _run(tmp_path, "a", port, "--child")
    kept.append(first.server.pid)
    assert first.success and first.server.kept and not first.server.reused and group_alive(first.server.pid)
    record = _record(tmp_path, port)
    assert record["pid"] == first.server.pid and record["engine"] == "vllm" and record["port"] == port
    assert record["command"] == first.server.command and record["process_start"] > 0
    assert "fake engine: listening" in (tmp_path / "a" / "server.log").read_text()

    second = _run(tmp_path, "b", port, "--child")
    assert second.success and second.server.reused and second.server.pid == first.server.pid
    assert second.server.ready_after_s == 0.0 and second.run.completed == 4
    assert "fake engine: listening" not in (tmp_path / "b" / "server.log").read_text()  # only its own part

    other = _run(tmp_path, "c", port, "--child", "--delay", "0.001")  # another command line
    kept.append(other.server.pid)
    assert other.success and not other.server.reused and other.server.pid != first.server.pid
    assert not group_alive(first.server.pid)  # the stale one was stopped
    assert _record(tmp_path, port)["pid"] == other.server.pid


def test_a_recorded_server_that_died_is_replaced(kept, tmp_path):
    port = free_port()
    first = _run(tmp_path, "a", port)
    kept.append(first.server.pid)
    os.killpg(first.server.pid, signal.SIGKILL)
    os.waitpid(first.server.pid, 0)  # our child: reaped, gone
    again = _run(tmp_path, "b", port)
    kept.append(again.server.pid)
    assert again.success and not again.server.reused and again.server.pid != first.server.pid


def test_a_failed_run_stops_its_server_for_good(kept, tmp_path):
    port = free_port()
    dying = _run(tmp_path, "a", port, "--mode", "die-after", "--n", "2")
    kept.append(dying.server.pid)
    assert not dying.success and not dying.server.kept and not group_alive(dying.server.pid)
    assert not (tmp_path / "servers" / f"127.0.0.1_{port}.json").exists()


def test_a_profiled_run_is_never_kept():
    with pytest.raises(ValueError, match="a profiled run starts a server of its own"):
        BenchmarkConfig(framework="transformers", model="m", profiler=True, server_lifecycle="reuse")


def test_stop_servers_ends_every_kept_server(kept, tmp_path, capsys):
    servers = [_run(tmp_path, f"r{i}", free_port()) for i in range(2)]
    kept.extend(s.server.pid for s in servers)
    assert all(group_alive(s.server.pid) for s in servers)
    assert main(["benchmark", "--stop-servers"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("stopped vllm fake-model on 127.0.0.1:") for line in lines)
    assert not any(group_alive(s.server.pid) for s in servers)
    assert main(["benchmark", "--stop-servers"]) == 0 and capsys.readouterr().out.strip() == "no kept servers"


def test_transformers_serve_is_kept_and_reused(tmp_path, tmp_path_factory, monkeypatch, capsys, tiny_model):
    """The real engine on the tiny offline model: a second --keep-server run with the same command reuses the kept
    `transformers serve` (same process, no start-up), a run with a different dtype replaces it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    monkeypatch.setenv(environment.SERVER_DIR, str(tmp_path / "servers"))
    model, port = tiny_model, free_port()
    reports = []
    try:
        for name, precision in (("a", "auto"), ("b", "auto"), ("c", "fp32")):
            rc = main(
                [
                    "benchmark",
                    "transformers",
                    "-m",
                    str(model),
                    "--port",
                    str(port),
                    "--keep-server",
                    "-p",
                    precision,
                    "--num-prompts",
                    "2",
                    "--concurrency",
                    "2",
                    "--input-len",
                    "8",
                    "--output-len",
                    "4",
                    "--timeout",
                    "240",
                    "-o",
                    str(tmp_path / name),
                    "--json",
                ]
            )
            capsys.readouterr()
            reports.append(json.loads((tmp_path / name / "benchmark_report.json").read_text()))
            assert rc == 0, reports[-1]["errors"]
    finally:
        lifecycle.stop_all()
    first, second, third = (r["server"] for r in reports)
    assert first["kept"] and not first["reused"] and first["ready_after_s"] > 0
    assert second["reused"] and second["pid"] == first["pid"] and second["ready_after_s"] == 0.0
    assert not third["reused"] and third["pid"] != first["pid"]
    assert reports[1]["run"]["total_output_tokens"] == 2 * 4
    assert not any(group_alive(s["pid"]) for s in (first, third))


def _running_elsewhere(tmp_path, name: str, port: int) -> subprocess.Popen:
    """A magpie run of the stand-in engine in a process of its own, its server started and its load under way."""
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from magpie.serving import engines
import test_serving_local as t
engines.get = lambda name: t.Fake()
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import run_benchmark
run_benchmark(BenchmarkConfig(framework="vllm", model="fake-model", port={port}, output_dir={str(tmp_path / name)!r},
    extra_server_args=["--delay", "0.5", "--child"], output_len=200, num_prompts=4, timeout_s=120))
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (tmp_path / "servers" / f"127.0.0.1_{port}.json").exists():
        time.sleep(0.05)
    assert _record(tmp_path, port)["owner"] == proc.pid
    return proc


def test_the_server_of_a_killed_run_is_stopped_by_the_next_and_a_live_runs_is_not(kept, tmp_path, capsys):
    ports = free_port(), free_port()
    killed, live = (_running_elsewhere(tmp_path, name, port) for name, port in zip("kl", ports))
    orphan, serving = (_record(tmp_path, port)["pid"] for port in ports)
    kept.extend((orphan, serving))
    try:
        killed.kill()
        killed.wait()
        assert group_alive(orphan)  # SIGKILL: nothing of magpie's stopped it
        report = _run(tmp_path, "next", free_port(), server_lifecycle="fresh")
        assert report.success
        warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("magpie: warning:")]
        assert warnings == [
            f"magpie: warning: stopped the server vllm fake-model on 127.0.0.1:{ports[0]} (pid "
            f"{orphan}), left by magpie pid {killed.pid}, which is gone"
        ]
        assert not group_alive(orphan) and not (tmp_path / "servers" / f"127.0.0.1_{ports[0]}.json").exists()
        assert group_alive(serving) and _record(tmp_path, ports[1])["owner"] == live.pid

        assert main(["benchmark", "--stop-servers"]) == 0  # it leaves a live run's server too
        assert capsys.readouterr().out.strip() == (
            f"left vllm fake-model on 127.0.0.1:{ports[1]} (pid {serving}): it serves the run of magpie pid {live.pid}"
        )
        assert group_alive(serving)
    finally:
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=30)
    assert not group_alive(serving) and not (tmp_path / "servers" / f"127.0.0.1_{ports[1]}.json").exists()


def test_a_kept_server_whose_reusing_run_was_killed_is_not_reused(kept, tmp_path, capsys):
    """A run killed while a kept server served it left the server mid-run: the next run stops it and starts afresh."""
    port = free_port()
    first = _run(tmp_path, "a", port)
    kept.append(first.server.pid)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "servers" / f"127.0.0.1_{port}.json"
    path.write_text(json.dumps({**_record(tmp_path, port), "owner": dead.pid, "owner_start": 1}))
    again = _run(tmp_path, "b", port)
    kept.append(again.server.pid)
    assert again.success and not again.server.reused and not group_alive(first.server.pid)
    assert (
        f"stopped the server vllm fake-model on 127.0.0.1:{port} (pid {first.server.pid}), left by magpie pid "
        f"{dead.pid}, which is gone" in capsys.readouterr().err
    )
