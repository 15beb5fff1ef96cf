"""Failures a user can act on (issue 40.7): the engine's own error line leads the error and the kept log tail
(engines log their shutdown after it); a failed `[[benchmark]]` build keeps its run's server log and report in
the workspace and names them (the run's folder is removed with the failed task), until a run succeeds; a model
folder that is not there is refused in one line, naming the flag or field, before any server starts; Ctrl-C
(a real SIGINT to a real `magpie benchmark` process) leaves a report marked partial with the requests that
completed before it, in vLLM's result file too."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ctrl_c_taken, magpie, write

from magpie.cli import main
from magpie.serving import engines
from magpie.serving.engines.base import Engine
from magpie.serving.local import free_port
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import REPORT, RESULT, run_benchmark
from magpie.serving.stub_server import Reply, ThreadedStubServer

FAKE = Path(__file__).parent / "fixtures" / "serving" / "fake_engine.py"
ERROR = "ValueError: model type `nonsense` is not a known architecture"


class Fake(Engine):
    name = "vllm"

    def program(self):
        return [sys.executable, str(FAKE)]

    def _flags(self, spec):
        return ["--host", spec.host, "--port", str(self.port(spec))]


def test_the_engines_error_line_leads_the_error_and_the_log_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "get", lambda name: Fake())
    report = run_benchmark(
        BenchmarkConfig(
            framework="vllm",
            model="fake-model",
            port=free_port(),
            num_prompts=2,
            output_dir=str(tmp_path / "ws"),
            timeout_s=60,
            extra_server_args=["--mode", "traceback"],
        )
    )
    log = tmp_path / "ws" / "server.log"
    assert not report.success
    assert report.errors[0] == f"the server exited with code 1 before it was ready: {ERROR}; log: {log}"
    assert report.errors[1].startswith(f"server log tail:\n{ERROR}\n[...]\n")  # 40 shutdown lines after it
    assert report.errors[1].endswith("INFO shutting down worker 39")


def test_error_line_prefers_the_exception_then_an_error_level_line(tmp_path):
    from magpie.serving.local import error_line, tail

    log = tmp_path / "server.log"
    log.write_text("INFO start\nERROR 12-03 engine core failed to start\nINFO bye\n")
    assert error_line(log) == "ERROR 12-03 engine core failed to start"
    log.write_text(
        "\x1b[31mtorch.OutOfMemoryError: CUDA out of memory.\x1b[0m\nERROR 12-03 shutting down\n" + "INFO bye\n" * 30
    )
    assert error_line(log) == "torch.OutOfMemoryError: CUDA out of memory."
    assert tail(log).startswith("torch.OutOfMemoryError: CUDA out of memory.\n[...]\n")
    log.write_text("INFO all well\n")
    assert error_line(log) == "" and tail(log) == "INFO all well"


def _project(root: Path, body: str) -> None:
    write(
        root,
        {
            "magpie.toml": f"""
        [project]
        name = "serve"

        [[benchmark]]
        id = "tiny"
        {body}
        timeout_s = 120

        [benchmark.load]
        concurrency = 1
        input_len = 4
        output_len = 2
        num_prompts = 2
        """
        },
    )


def test_a_failed_benchmark_build_keeps_its_server_log_until_a_run_succeeds(tmp_path):
    broken = tmp_path / "models" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text('{"model_type": "nonsense"}')  # transformers serve exits at its start
    _project(tmp_path, f'engine = "transformers"\nmodel = "models/broken"\nport = {free_port()}')
    proc = magpie("build", "--json", cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stderr
    kept = tmp_path / "workspaces" / "failed" / "benchmark" / "tiny"
    log = kept / "server.log"
    error = json.loads(proc.stdout)["failures"]["benchmark:tiny"]
    assert f"log: {log}" in error and f"its files are kept in {kept}" in error
    assert "ValueError: The checkpoint you are trying to load has model type `nonsense`" in error
    assert "ValueError: The checkpoint" in log.read_text()
    report = json.loads((kept / REPORT).read_text())
    assert report["success"] is False and report["workspace_dir"] == str(kept)
    assert report["outputs"]["server_log"] == str(log)

    with ThreadedStubServer() as stub:  # the same benchmark, now one that succeeds
        _project(tmp_path, f'engine = "external"\nmodel = "tiny"\nbase_url = "{stub.base_url}"')
        proc = magpie("build", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["failed"] == [] and not kept.exists()


def test_a_missing_model_folder_is_refused_before_anything_starts(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    _project(tmp_path, f'engine = "transformers"\nmodel = "models/tny"\nport = {free_port()}')
    started = time.monotonic()
    proc = magpie("build", cwd=tmp_path)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    assert proc.stderr.strip().splitlines() == [
        "magpie: magpie.toml: benchmark[0].model: no model folder 'models/tny' next to the manifest: "
        "give the folder holding the model (config.json, weights), relative to the manifest, or a hub id (org/name)"
    ]
    assert not (tmp_path / "workspaces" / "failed").exists()

    missing = tmp_path / "nope"
    assert main(["benchmark", "transformers", "-m", str(missing), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"magpie: -m: no model folder {missing}: give the folder holding the model (config.json, weights) or a hub "
        "id (org/name)"
    )
    yaml = tmp_path / "bench.yaml"
    yaml.write_text("benchmark:\n  framework: transformers\n  model: ./nope\n")
    assert main(["benchmark", "--benchmark-config", str(yaml), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().startswith(f"magpie: {yaml}: benchmark.model: no model folder {missing}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_saves_a_partial_report_of_the_completed_requests(tmp_path, stop):
    arrived = []
    seen = threading.Condition()

    def script(path, body):
        with seen:
            arrived.append(path)
            seen.notify_all()
        return Reply(first_delay=0.05, delays=[0.05] * 8)

    out = tmp_path / "run"
    with ThreadedStubServer(script=script) as stub:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "magpie",
                "benchmark",
                "external",
                "-m",
                "tiny",
                "--base-url",
                stub.base_url,
                "--num-prompts",
                "200",
                "--concurrency",
                "2",
                "--input-len",
                "4",
                "--output-len",
                "8",
                "-o",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ctrl_c_taken,
        )
        with seen:
            assert seen.wait_for(lambda: len(arrived) >= 8, timeout=60), proc.stderr
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"partial where requests had completed): {out / REPORT}" in err
    report = json.loads((out / REPORT).read_text())
    assert report["partial"] is True and report["success"] is False and not report["reward_eligible"]
    completed = report["run"]["completed"]
    # at concurrency 2 the eighth arrival means six requests had ended at the server; the client counts each a
    # moment later, so the signal may land before it counted the last one or two
    assert 4 <= completed < 200 and report["run"]["failed"] == 0
    assert report["errors"][0] == (
        f"interrupted (Ctrl-C or SIGTERM): the report is partial, the {completed} requests finished before it"
    )
    assert report["run"]["total_output_tokens"] == 8 * completed and report["latency"]["ttft"]["median_ms"] > 0
    result = json.loads((out / RESULT).read_text())
    assert result["completed"] == completed and result["duration"] > 0
