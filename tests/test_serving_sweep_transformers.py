"""A sweep against the real `transformers serve` on the tiny offline model (CPU): the README's sweep command, one
server start for every point and repeat, each run's figures real and its output lengths exact, the server stopped
at the end. One server start for the module (about a minute on the CPU machine)."""

import json

import pytest
from conftest import magpie_in_process

from magpie import environment
from magpie.serving.local import free_port, group_alive


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("sweep_transformers")
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path_factory.mktemp("hf_home")),
        environment.SERVER_DIR: str(tmp / "servers"),
    }
    proc = magpie_in_process(
        "benchmark", "transformers", "-m", tiny_model, "--port", free_port(), "--input-len", "8", "--output-len", "4",
        "--num-prompts", "3", "--sweep", "concurrency=1,2", "--repeats", "2", "--timeout", "300", "-o", tmp / "out",
        cwd=tmp, env=env,
    )  # fmt: skip
    return proc, tmp


def test_a_transformers_serve_sweep_starts_one_server_for_all_its_runs(swept):
    proc, tmp = swept
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp / "out" / "sweep_report.json").read_text())
    assert report["success"] and report["server"]["starts"] == 1 and len(report["server"]["pids"]) == 1
    assert not group_alive(report["server"]["pids"][0]) and not list((tmp / "servers").glob("*.json"))
    assert "server: 1 start(s) for 4 runs" in proc.stdout
    for point in report["points"]:
        assert [r["server_reused"] for r in point["repeats"]] == (
            [False, True] if point["label"].endswith("=1") else [True, True]
        )
        for run in point["repeats"]:
            result = json.loads(
                (tmp / "out" / point["label"] / run["workspace"] / "bench_serve_result.json").read_text()
            )
            assert result["completed"] == 3 and result["total_output_tokens"] == 12  # exact lengths
        keys = point["inferencemax"]
        assert keys["output_tput_per_gpu"] > 0 and keys["median_intvty"] > 0 and keys["p99.9_ttft"] > 0
    assert report["pareto_frontier"] and (tmp / "out" / "sweep_pareto.svg").read_text().startswith("<svg")


@pytest.mark.gpu
def test_a_sweep_on_the_gpu_keeps_one_server_on_the_gpu_it_picked(tiny_model, tmp_path, monkeypatch):
    """The H200 check: the kept server's own process makes its GPU look busy, yet every later run of the sweep
    takes that GPU and reuses the server (one start), with the GPU monitor's readings in each run's report."""
    from magpie.serving.gpus import PIN_VARIABLES

    for name in PIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(environment.SERVER_DIR, str(tmp_path / "servers"))
    proc = magpie_in_process(
        "benchmark", "transformers", "-m", tiny_model, "--port", free_port(), "--input-len", "16", "--output-len", "8",
        "--num-prompts", "4", "--sweep", "concurrency=1,2", "--repeats", "2", "--timeout", "300",
        "-o", tmp_path / "out", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "out" / "sweep_report.json").read_text())
    assert report["success"] and report["server"]["starts"] == 1
    devices = set()
    for point in report["points"]:
        for run in point["repeats"]:
            saved = json.loads(
                (tmp_path / "out" / point["label"] / run["workspace"] / "benchmark_report.json").read_text()
            )
            allocation = saved["provenance"]["gpu_allocation"]
            devices.add(tuple(allocation["devices"]))
            assert allocation.get("kept_server", False) == run["server_reused"] and saved["gpu_monitor"] is not None
        assert point["inferencemax"]["output_tput_per_gpu"] > 0 and point["inferencemax"]["median_intvty"] > 0
    assert len(devices) == 1 and not list((tmp_path / "servers").glob("*.json"))
