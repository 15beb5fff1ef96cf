"""A declared benchmark with `profiler = true` builds three nodes: the clean measurement run (measurement,
reward-eligible, no profiler), a separate profiled run (diagnostic, traces in its torch_trace/) that starts only
after the measurement, and the trace analysis of those traces, each cached and rebuilt only when its inputs
change; the build report shows the measurement and summarises and links the analysis. End to end with the real
`transformers serve` on the CPU serving the tiny offline model."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, build_json, magpie, write

from magpie.serving.local import free_port

NODES = ("benchmark:tiny", "benchmark_profile:tiny", "benchmark_trace_analysis:tiny")


def _declare(root: Path, num_prompts: int, port: int, profiler: str = "true") -> None:
    base = (root / "magpie.toml").read_text().split("\n[[benchmark]]")[0]
    (root / "magpie.toml").write_text(
        base
        + f"""
[[benchmark]]
id = "tiny"
engine = "transformers"
model = "models/tiny"
port = {port}
profiler = {profiler}
timeout_s = 300

[benchmark.load]
concurrency = 2
input_len = 8
output_len = 4
num_prompts = {num_prompts}
"""
    )


def _artifact(root: Path, task: str) -> Path:
    from magpie.project import Project

    project = Project.load(root / "magpie.toml")
    return project.store.path(project.tasks[task].key)


def _plan(root: Path) -> dict[str, str]:
    plan = json.loads(magpie("build", "--dry-run", "--json", cwd=root, check=0).stdout)
    return {item["task"]: item["why"] for item in plan["would_run"]}


def test_profiled_nodes_exist_only_when_declared_and_the_measurement_key_ignores_the_flag(tmp_path):
    from magpie.graph.expand import expand
    from magpie.graph.rules import builtin_rules
    from magpie.manifest.models import Manifest

    def tasks(profiler: bool):
        manifest = Manifest.model_validate(
            {
                "benchmark": [
                    {"id": "tiny", "engine": "transformers", "model": "m", "profiler": profiler},
                    {"id": "plain", "engine": "vllm", "model": "org/m"},
                ]
            }
        )
        return expand(manifest, tmp_path, builtin_rules())

    profiled, plain = tasks(True), tasks(False)
    assert set(NODES) <= set(profiled) and not any(
        name.endswith(":plain") and name != "benchmark:plain" for name in profiled
    )
    assert profiled["benchmark_trace_analysis:tiny"].deps == ["benchmark_profile:tiny"]
    assert profiled["benchmark_profile:tiny"].after == ["benchmark:tiny", "benchmark:plain"]  # order only
    assert {"benchmark:tiny", "benchmark:plain", "benchmark_trace_analysis:tiny"} <= set(profiled["report"].deps)
    assert "benchmark_profile:tiny" not in plain
    assert profiled["benchmark:tiny"].key == plain["benchmark:tiny"].key  # declaring a profile re-runs nothing


@pytest.fixture
def project(tmp_path, tmp_path_factory, monkeypatch, tiny_model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    write(tmp_path, COMMAND_PROJECT)
    shutil.copytree(tiny_model, tmp_path / "models" / "tiny")
    return tmp_path


def test_profiled_benchmark_builds_measurement_profile_and_analysis_cached_and_rebuilt(project):
    port = free_port()
    _declare(project, num_prompts=3, port=port)
    first = build_json(project)
    assert set(NODES) | {"report"} <= set(first["executed"]) and first["failed"] == []

    measured = _artifact(project, "benchmark:tiny")
    report = json.loads((measured / "benchmark_report.json").read_text())
    assert report["success"] and report["run_kind"] == "measurement" and report["reward_eligible"]
    assert not report["profiling_enabled"] and not (measured / "torch_trace").exists()
    assert report["server"]["command"][1:3] != ["-m", "magpie.serving.torch_launcher"]  # no profiler in it

    profiled = _artifact(project, "benchmark_profile:tiny")
    run = json.loads((profiled / "benchmark_report.json").read_text())
    assert run["success"] and run["run_kind"] == "diagnostic" and not run["reward_eligible"]
    assert list((profiled / "torch_trace").glob("*.json")) and run["tracelens_analysis"] is None
    started = {name: json.loads((_artifact(project, name) / "result.json").read_text()) for name in NODES[:2]}
    measurement = started["benchmark:tiny"]
    assert (
        started["benchmark_profile:tiny"]["task_started_unix"]
        >= measurement["task_started_unix"] + measurement["task_seconds"] - 0.01
    )  # never side by side

    published = project / "workspaces" / "reports" / "benchmarks" / "tiny"
    analysed = json.loads((published / "benchmark_report.json").read_text())
    tracelens = analysed["tracelens_analysis"]
    assert tracelens["outputs"] and tracelens["errors"] == [] and analysed["run_kind"] == "diagnostic"
    assert all((published / path).is_file() for path in tracelens["outputs"])
    assert (published / "trace_report.html").is_file() and (published / "gap_analysis" / "gap_analysis.csv").is_file()
    assert analysed["kernel_summary"] == [] and analysed["gap_analysis"]["kernels"] == 0
    assert "no GPU kernels" in analysed["gap_analysis"]["explanation"]
    md = (project / "workspaces" / "reports" / "summary.md").read_text()
    assert "### tiny: profiled run and its trace analysis" in md and "benchmarks/tiny/trace_report.html" in md
    html = (project / "workspaces" / "reports" / "report.html").read_text()
    assert 'href="benchmarks/tiny/trace_report.html"' in html

    assert build_json(project)["executed"] == []  # cached: nothing re-runs

    _declare(project, num_prompts=4, port=port)  # the load changed
    why = _plan(project)
    assert set(why) == set(NODES) | {"report"}
    assert why["benchmark:tiny"] == why["benchmark_profile:tiny"] == "benchmark settings changed"
    assert why["benchmark_trace_analysis:tiny"] == "benchmark_profile:tiny rebuilt"
    again = build_json(project)
    assert set(again["executed"]) == set(NODES) | {"report"} and again["failed"] == []
    analysed = json.loads((published / "benchmark_report.json").read_text())
    assert analysed["run"]["completed"] == 4 and analysed["tracelens_analysis"]["errors"] == []


def test_a_benchmark_id_selects_its_tasks(tmp_path):
    write(tmp_path, COMMAND_PROJECT)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    _declare(tmp_path, num_prompts=2, port=free_port())
    plan = json.loads(magpie("build", "--dry-run", "--json", "tiny", cwd=tmp_path, check=0).stdout)
    assert {item["task"] for item in plan["would_run"]} == set(NODES)


def test_traces_the_analysis_cannot_read_are_a_failed_analysis_in_the_report(tmp_path):
    from types import SimpleNamespace

    from magpie.report.render import render
    from magpie.serving.build_rule import trace_analysis_rule

    run_dir = tmp_path / "profiled"
    (run_dir / "torch_trace").mkdir(parents=True)
    (run_dir / "torch_trace" / "host_1.pt.trace.json").write_text('{"traceEvents": [')
    job = SimpleNamespace(
        spec=SimpleNamespace(params={"benchmark": {"id": "tiny"}}),
        dep_dirs={"benchmark_profile:tiny": str(run_dir)},
        dep_results={"benchmark_profile:tiny": {"summary": {"completed": 3}}},
    )
    (tmp_path / "out").mkdir()
    result = trace_analysis_rule(job, tmp_path / "out")
    assert result["state"] == "FAILED" and result["errors"] and result["profiled_run"] == {"completed": 3}
    bench = {
        "benchmark": "tiny",
        "engine": "transformers",
        "model": "m",
        "run_kind": "measurement",
        "summary": {"completed": 3, "failed": 0, "errors": []},
        "analysis": result,
    }
    md = render([], "p", [], [bench])["summary.md"]
    assert "### tiny: profiled run and its trace analysis" in md and "Trace analysis failed: " in md


def _declare_kept(root: Path, port: int) -> None:
    """Two benchmarks of one engine and model whose servers would be the same (their loads differ), both kept."""
    base = (root / "magpie.toml").read_text().split("\n[[benchmark]]")[0]
    (root / "magpie.toml").write_text(
        base
        + "".join(
            f"""
[[benchmark]]
id = "{name}"
engine = "transformers"
model = "models/tiny"
port = {port}
keep_server = true
timeout_s = 300

[benchmark.load]
concurrency = 2
input_len = 8
output_len = 4
num_prompts = {prompts}
"""
            for name, prompts in (("a", 2), ("b", 3))
        )
    )


def test_keep_server_is_validated_and_not_in_the_key(tmp_path):
    from pydantic import ValidationError

    from magpie.graph.expand import expand
    from magpie.graph.rules import builtin_rules
    from magpie.manifest.models import Manifest

    def key(**kw):
        manifest = Manifest.model_validate({"benchmark": [{"id": "t", "engine": "vllm", "model": "org/m", **kw}]})
        return expand(manifest, tmp_path, builtin_rules())["benchmark:t"].key

    assert key(keep_server=True) == key()
    for bad in ({"run_mode": "docker"}, {"engine": "external", "base_url": "http://127.0.0.1:1"}):
        with pytest.raises(ValidationError, match="keep_server keeps a local server of magpie's"):
            Manifest.model_validate(
                {"benchmark": [{"id": "t", "engine": "vllm", "model": "m", "keep_server": True, **bad}]}
            )


def test_a_build_reuses_a_kept_server_across_its_benchmarks_and_clean_stops_it(project, monkeypatch):
    """`keep_server = true`: the build's second benchmark is served by the server the first kept (recorded as
    reused in its provenance), the server outlives the build, and `magpie clean` stops it."""
    from magpie import environment
    from magpie.serving import lifecycle
    from magpie.serving.local import group_alive

    monkeypatch.setenv(environment.SERVER_DIR, str(project / "servers"))
    _declare_kept(project, free_port())
    try:
        built = build_json(project)
        assert {"benchmark:a", "benchmark:b"} <= set(built["executed"]) and built["failed"] == []
        reports = {
            name: json.loads((_artifact(project, f"benchmark:{name}") / "benchmark_report.json").read_text())
            for name in "ab"
        }
        first, second = sorted(reports.values(), key=lambda r: r["provenance"]["server_reused"])
        assert first["success"] and second["success"] and second["run"]["completed"] + first["run"]["completed"] == 5
        assert not first["provenance"]["server_reused"] and second["provenance"]["server_reused"]
        assert second["server"]["reused"] and second["server"]["pid"] == first["server"]["pid"]
        assert second["server"]["ready_after_s"] == 0.0
        pid = first["server"]["pid"]
        assert group_alive(pid)  # kept past the build's end
        cleaned = magpie("clean", cwd=project, check=0).stdout
        assert f"magpie: stopped transformers {project / 'models' / 'tiny'} on 127.0.0.1:" in cleaned, cleaned
        assert not group_alive(pid) and not list((project / "servers").glob("*.json"))
    finally:
        lifecycle.stop_all()
