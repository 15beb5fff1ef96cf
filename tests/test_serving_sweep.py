"""Sweeps (magpie/serving/sweep.py, issue 40.8) with the stand-in engine (tests/fixtures/serving/fake_engine.py):
every point repeated against one server start, InferenceMAX's keys and intervals per point, the Pareto frontier
and its plot, the CLI's and the YAML's sweep, bad sweeps refused in one line, and in a build one node per point,
cached on its own (adding a value runs only its point), the points sharing one server that the sweep's node stops."""

import json
import math
from pathlib import Path

import pytest
from conftest import magpie_in_process
from test_serving_local import Fake

from magpie import environment
from magpie.manifest.sweep_axes import SweepAxes, parse_sweep
from magpie.serving import engines, lifecycle
from magpie.serving.local import free_port, group_alive
from magpie.serving.report import BenchmarkConfig
from magpie.serving.sweep import (
    Interval,
    PointResult,
    inferencemax_keys,
    interval,
    pareto_frontier,
    run_sweep,
)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The stand-in engine, server records in the test's own folder; nothing may be left running after it."""
    monkeypatch.setattr(engines, "get", lambda name: Fake())
    monkeypatch.setenv(environment.SERVER_DIR, str(tmp_path / "servers"))
    yield
    lines = lifecycle.stop_all()
    assert not lines, f"a server was left running: {lines}"


def _config(tmp_path, name="ws", **kw) -> BenchmarkConfig:
    return BenchmarkConfig(
        **{
            **dict(
                framework="vllm",
                model="fake-model",
                port=free_port(),
                input_len=8,
                output_len=5,
                num_prompts=6,
                output_dir=str(tmp_path / name),
                timeout_s=60,
                extra_server_args=["--delay", "0.002"],
            ),
            **kw,
        }
    )


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep over concurrency 1, 2, 4, three repeats each, shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engines, "get", lambda name: Fake())
        patch.setenv(environment.SERVER_DIR, str(tmp / "servers"))
        report = run_sweep(_config(tmp), SweepAxes(concurrency=[1, 2, 4]), 3)
        left = lifecycle.stop_all()
    return report, tmp / "ws", left


def test_every_point_is_repeated_against_one_server_start_which_is_stopped_after(swept):
    report, work, left = swept
    assert report.success and not report.errors and left == []
    assert [p.label for p in report.points] == ["concurrency=1", "concurrency=2", "concurrency=4"]
    assert report.server.starts == 1 and len(report.server.pids) == 1 and not report.server.kept
    assert not group_alive(report.server.pids[0])
    for point in report.points:
        assert [r.workspace for r in point.repeats] == ["repeat_1", "repeat_2", "repeat_3"]
        assert all(r.success and r.server_pid == report.server.pids[0] for r in point.repeats)
        for run in point.repeats:
            result = json.loads((work / point.label / run.workspace / "bench_serve_result.json").read_text())
            assert result["max_concurrency"] == point.point["concurrency"] and result["completed"] == 6
            assert "p99.9_ttft_ms" in result and "p75_e2el_ms" in result  # InferenceMAX's percentiles


def test_each_point_has_inferencemax_keys_with_intervals_over_its_repeats(swept):
    report, work, _ = swept
    for point in report.points:
        keys = point.inferencemax
        assert keys["conc"] == point.point["concurrency"] and keys["tp"] == 1 and keys["isl"] == 8
        for name in ("tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu", "median_intvty"):
            assert keys[name] > 0, name
        for metric in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("p75", "p90", "p95", "p99", "p99.9"):
                assert keys[f"{stat}_{metric}"] > 0, f"{stat}_{metric}"
        per_repeat = [r.inferencemax["output_tput_per_gpu"] for r in point.repeats]
        assert keys["output_tput_per_gpu"] == sorted(per_repeat)[1]  # the median of three
        iv = point.intervals["output_tput_per_gpu"]
        assert iv.n == 3 and iv.low <= iv.mean <= iv.high and iv.mean == pytest.approx(sum(per_repeat) / 3)
        saved = json.loads((work / point.label / "point.json").read_text())
        assert saved["inferencemax"]["tput_per_gpu"] == keys["tput_per_gpu"]


def test_the_sweep_report_table_and_pareto_plot_are_written(swept):
    report, work, _ = swept
    saved = json.loads((work / "sweep_report.json").read_text())  # strict JSON: no Infinity
    assert saved["pareto_frontier"] == report.pareto_frontier and saved["pareto_frontier"]
    assert saved["config"]["request_rate"] == "inf" and len(saved["points"]) == 3
    svg = (work / "sweep_pareto.svg").read_text()
    assert svg.count('class="point') == 3 and svg.count('class="point pareto"') == len(report.pareto_frontier)
    assert "interactivity" in svg and "output tokens/s per GPU" in svg
    page = (work / "sweep_report.html").read_text()
    assert "<svg" in page and all(f"<td>{p.label}</td>" in page for p in report.points)


def test_later_runs_take_the_gpus_of_the_kept_server_its_own_process_makes_busy(fake, tmp_path, monkeypatch):
    """On a GPU the kept server's process makes its GPU look busy: the sweep's later runs take its GPUs (and so
    reuse it) instead of failing to find an idle one."""
    from magpie.serving import gpus

    for name in gpus.PIN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    asked = []

    def one_gpu():
        asked.append(1)  # idle when the first run picks it; then the kept server's process runs there
        busy = len(asked) > 1
        return (
            [gpus.GpuState(index=0, total_mib=80000, free_mib=1000 if busy else 80000, processes=int(busy))],
            "nvml",
            "",
        )

    monkeypatch.setattr(gpus, "gpu_states", one_gpu)
    report = run_sweep(_config(tmp_path), SweepAxes(concurrency=[1, 2]), 2)
    assert report.success, report.errors
    assert report.server.starts == 1 and len(asked) == 1  # one pick; the later runs took the kept server's GPU
    for point in report.points:
        for run in point.repeats:
            saved = json.loads((tmp_path / "ws" / point.label / run.workspace / "benchmark_report.json").read_text())
            allocation = saved["provenance"]["gpu_allocation"]
            assert allocation["devices"] == [0]
            assert allocation.get("kept_server", False) == run.server_reused


def _point(name, x, y, success=True):
    return PointResult(
        label=name,
        point={},
        success=success,
        repeats=[],
        inferencemax={"median_intvty": x, "output_tput_per_gpu": y},
    )


def test_the_pareto_frontier_is_the_points_nothing_beats_on_both_axes():
    points = [
        _point("a", 10, 100),
        _point("b", 20, 90),
        _point("c", 15, 80),  # beaten by b on both
        _point("d", 5, 100),  # beaten by a: as much throughput, less interactivity
        _point("e", 30, 10),
        _point("f", 40, 500, success=False),  # a failed point is not placed
    ]
    assert pareto_frontier(points) == ["a", "b", "e"]


def test_inferencemax_keys_follow_its_process_result():
    raw = {
        "model_id": "m",
        "max_concurrency": 8,
        "request_rate": "inf",
        "request_throughput": 3.0,
        "total_token_throughput": 1200.0,
        "output_throughput": 400.0,
        "median_tpot_ms": 20.0,
        "p99.9_ttft_ms": 250.0,
        "p75_itl_ms": 8.0,
        "mean_tpot_ms": 0.0,  # no request of two tokens: no interactivity, never Infinity
    }
    config = BenchmarkConfig(framework="vllm", model="m", tp=4, input_len=1024, output_len=128)
    keys = inferencemax_keys(raw, config)
    assert keys["tput_per_gpu"] == 300.0 and keys["output_tput_per_gpu"] == 100.0
    assert keys["input_tput_per_gpu"] == 200.0 and keys["conc"] == 8 and keys["isl"] == 1024
    assert keys["median_tpot"] == 0.02 and keys["median_intvty"] == 50.0
    assert keys["p99.9_ttft"] == 0.25 and keys["p75_itl"] == 0.008
    assert keys["mean_intvty"] is None


def test_intervals_are_student_t_over_the_repeats():
    iv = interval([10.0, 12.0, 14.0])
    half = 4.303 * 2.0 / math.sqrt(3)
    assert iv.median == 12.0 and iv.low == pytest.approx(12 - half) and iv.high == pytest.approx(12 + half)
    assert interval([5.0]) == Interval(median=5.0, mean=5.0, low=None, high=None, n=1)
    assert interval([0.1, 0.2, 3.0]).low == 0.0  # a time's interval stops at 0


def test_sweep_arguments_are_parsed_and_bad_ones_refused():
    axes = parse_sweep(["concurrency=1,2", "request_rate=inf,2.5"])
    assert [p for p in axes.points()][:2] == [
        {"concurrency": 1, "request_rate": math.inf},
        {"concurrency": 1, "request_rate": 2.5},
    ]
    assert len(axes.points()) == 4
    for bad, words in (
        (["threads=1,2"], "AXIS one of concurrency, request_rate, input_len, output_len"),
        (["concurrency=1,1"], "given twice"),
        (["concurrency=0,2"], "above 0"),
        (["concurrency=two"], "concurrency"),
        (["concurrency=1", "concurrency=2"], "concurrency is given twice"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_sweep(bad)


def test_the_cli_sweeps_against_one_server_and_prints_the_table(fake, tmp_path):
    port = free_port()
    args = ["benchmark", "vllm", "-m", "fake-model", "--port", port, "--input-len", "8", "--output-len", "4"]
    args += ["--num-prompts", "4", "--timeout", "60", "-o", tmp_path / "out"]
    proc = magpie_in_process(*args, "--sweep", "concurrency=1,2", "--repeats", "2", cwd=tmp_path, check=0)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| point | Pareto | repeats | total tok/s/GPU |"), proc.stdout
    assert lines[2].startswith("| concurrency=1 |") and lines[3].startswith("| concurrency=2 |")
    assert "server: 1 start(s) for 4 runs" in proc.stdout
    saved = json.loads((tmp_path / "out" / "sweep_report.json").read_text())
    assert saved["success"] and saved["repeats"] == 2 and saved["server"]["starts"] == 1
    assert not list((tmp_path / "servers").glob("*.json"))  # the server was stopped at the sweep's end


def test_the_cli_refuses_bad_sweeps_in_one_line(fake, tmp_path):
    base = ["benchmark", "vllm", "-m", "fake-model", "--input-len", "8", "-o", tmp_path / "out"]
    for extra, words in (
        (["--repeats", "2"], "--repeats: the runs of each sweep point; give --sweep"),
        (["--sweep", "workers=1"], "--sweep 'workers=1': give AXIS=V1,V2,..."),
        (["--sweep", "concurrency=1", "--torch-profiler"], "a sweep measures"),
        (["--sweep", "concurrency=1", "--repeats", "0"], "repeats: at least 1"),
        (["--sweep", "input_len=8,5000", "--max-model-len", "2048"], "sweep point input_len=5000: prompts of"),
    ):
        proc = magpie_in_process(*base, *extra, cwd=tmp_path, check=2)
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "servers").exists() or not list((tmp_path / "servers").glob("*.json"))


def test_the_yaml_sweep_and_repeats(fake, tmp_path):
    from magpie.serving.bench_config import load_benchmark_sweep

    good = tmp_path / "sweep.yaml"
    good.write_text(
        "benchmark:\n  framework: vllm\n  model: fake-model\n  envs: {ISL: 8, OSL: 4, NUM_PROMPTS: 4}\n"
        "  sweep: {concurrency: [1, 2], request_rate: [inf]}\n  repeats: 2\n"
    )
    axes, repeats = load_benchmark_sweep(good)
    assert repeats == 2 and axes.points() == [
        {"concurrency": 1, "request_rate": math.inf},
        {"concurrency": 2, "request_rate": math.inf},
    ]
    proc = magpie_in_process(
        "benchmark", "--benchmark-config", good, "--port", free_port(), "-o", tmp_path / "y", cwd=tmp_path, check=0
    )
    assert "| concurrency=2,request_rate=inf |" in proc.stdout and "server: 1 start(s) for 4 runs" in proc.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("benchmark:\n  framework: vllm\n  model: fake-model\n  repeats: 2\n")
    proc = magpie_in_process("benchmark", "--benchmark-config", bad, cwd=tmp_path, check=2)
    assert "benchmark.repeats" in proc.stderr or "repeats: the runs of each sweep point" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- in a build ------------------------------------------------------------------------------------------------


def _declare(root: Path, port: int, values: list[int], keep: bool = False) -> None:
    (root / "magpie.toml").write_text(
        f"""[project]
name = "sweeps"

[[benchmark]]
id = "s"
engine = "vllm"
model = "fake-model"
port = {port}
extra_server_args = ["--delay", "0.002"]
keep_server = {"true" if keep else "false"}
timeout_s = 60
sweep = {{ concurrency = {values} }}
repeats = 2

[benchmark.load]
input_len = 8
output_len = 4
num_prompts = 4
"""
    )


def _build(root: Path) -> dict:
    return json.loads(magpie_in_process("build", "--json", cwd=root, check=0).stdout)


def test_a_declared_sweep_has_a_node_per_point_cached_on_its_own_sharing_one_server(fake, tmp_path):
    from magpie.project import Project

    root, port = tmp_path / "p", free_port()
    root.mkdir()
    _declare(root, port, [1, 2])
    built = _build(root)
    points = ["benchmark:s/concurrency-1", "benchmark:s/concurrency-2"]
    assert set(points + ["benchmark_sweep:s"]) <= set(built["executed"]) and built["failed"] == []
    project = Project.load(root / "magpie.toml")
    sweep_dir = project.store.path(project.tasks["benchmark_sweep:s"].key)
    report = json.loads((sweep_dir / "sweep_report.json").read_text())
    assert report["success"] and [p["label"] for p in report["points"]] == ["concurrency=1", "concurrency=2"]
    assert report["server"] == {"starts": 1, "pids": report["server"]["pids"], "kept": False}
    assert len(report["server"]["pids"]) == 1 and not group_alive(report["server"]["pids"][0])
    assert (sweep_dir / "sweep_pareto.svg").read_text().startswith("<svg")
    assert not list((tmp_path / "servers").glob("*.json"))  # the last point's node stopped the kept server
    summary = (root / "workspaces" / "reports" / "summary.md").read_text()
    assert "| s concurrency=1 |" in summary and "| s concurrency=2 |" in summary  # a row per point
    assert "### s: sweep" in summary and "| concurrency=2 |" in summary  # the sweep's own table
    page = (root / "workspaces" / "reports" / "report.html").read_text()
    assert 'id="sweep-s"' in page and 'class="point' in page  # its Pareto plot
    assert (root / "workspaces" / "reports" / "sweeps" / "s" / "sweep_report.html").is_file()  # published

    _declare(root, port, [1, 2, 4])  # a value added: only its point (and what reads the points) runs
    again = _build(root)
    assert "benchmark:s/concurrency-4" in again["executed"] and "benchmark_sweep:s" in again["executed"]
    assert not set(points) & set(again["executed"]) and again["failed"] == []
    project = Project.load(root / "magpie.toml")
    report = json.loads((project.store.path(project.tasks["benchmark_sweep:s"].key) / "sweep_report.json").read_text())
    assert len(report["points"]) == 3 and report["server"]["starts"] == 2  # each build started one
    assert not list((tmp_path / "servers").glob("*.json"))

    assert _build(root)["executed"] == []  # nothing edited: nothing runs


def test_declared_sweeps_are_validated(tmp_path):
    from pydantic import ValidationError

    from magpie.manifest.models import Manifest

    base = {"id": "t", "engine": "vllm", "model": "org/m"}
    for extra, words in (
        ({"repeats": 2}, "repeats: the runs of each sweep point"),
        ({"sweep": {"concurrency": [1]}, "profiler": True}, "drop profiler"),
        ({"sweep": {"concurrency": [1]}, "run_mode": "docker"}, 'drop run_mode = "docker"'),
        ({"sweep": {"threads": [1]}}, "threads"),
    ):
        with pytest.raises(ValidationError, match=words):
            Manifest.model_validate({"benchmark": [{**base, **extra}]})


def test_ctrl_c_during_a_sweep_saves_the_points_run_before_it(tmp_path):
    """A real SIGINT to `magpie benchmark --sweep` in its second point: exit 130, and sweep_report.json marked
    partial with the first point whole and the second's interrupted run."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import ctrl_c_taken

    from magpie.serving.stub_server import Reply, ThreadedStubServer

    out = tmp_path / "sweep"
    second = out / "concurrency=2,output_len=8" / "repeat_1"
    with ThreadedStubServer(script=lambda path, body: Reply(first_delay=0.02, delays=[0.02] * 8)) as stub:
        proc = subprocess.Popen(
            [sys.executable, "-m", "magpie", "benchmark", "external", "-m", "tiny", "--base-url", stub.base_url]
            + ["--num-prompts", "40", "--input-len", "4", "--output-len", "8", "--sweep", "concurrency=1,2"]
            + ["--sweep", "output_len=8", "--repeats", "1", "-o", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ctrl_c_taken,
        )
        deadline = time.monotonic() + 120
        while not (second / "benchmark_config.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # some of the second point's requests complete
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"sweep interrupted; report of the points run: {out / 'sweep_report.json'}" in err
    report = json.loads((out / "sweep_report.json").read_text())
    assert report["partial"] is True and report["success"] is False
    first, interrupted = report["points"]
    assert first["label"] == "concurrency=1,output_len=8" and first["success"] and first["inferencemax"]["conc"] == 1
    assert interrupted["label"] == "concurrency=2,output_len=8" and not interrupted["success"]
    assert [r["workspace"] for r in interrupted["repeats"]] == ["repeat_1"]
    run = json.loads((second / "benchmark_report.json").read_text())
    assert run["partial"] is True and 0 < run["run"]["completed"] < 40
