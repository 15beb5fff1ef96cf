"""Declared benchmarks (`[[benchmark]]` in magpie.toml) as nodes of the build graph (rules/serving.toml): built like
any artifact, keyed by their config, the model folder's content and the engine's version, cached otherwise; the build
report's serving section. Graph behaviour against the stub server (engine external); one real `transformers serve`
build on the tiny offline model."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, build_json, magpie, write

from magpie.serving.local import free_port
from magpie.serving.stub_server import ThreadedStubServer


def _bench(base_url: str, num_prompts: int = 4, extra: str = "") -> str:
    return f"""
[[benchmark]]
id = "stub"
engine = "external"
model = "tiny"
base_url = "{base_url}"
{extra}
[benchmark.load]
concurrency = 2
input_len = 4
output_len = 3
num_prompts = {num_prompts}

[benchmark.slo]
ttft_ms = 5000
"""


@pytest.fixture
def project(tmp_path):
    write(tmp_path, COMMAND_PROJECT)
    return tmp_path


def _with(root: Path, tables: str) -> None:
    base = (root / "magpie.toml").read_text().split("\n[[benchmark]]")[0]
    (root / "magpie.toml").write_text(base + tables)


def _stored(root: Path, name: str) -> Path:
    index = json.loads(magpie("build", "--dry-run", "--json", cwd=root, check=0).stdout)
    assert index["would_run"] == []
    matches = list((root / "workspaces" / "store").rglob("benchmark_report.json"))
    assert matches, "no benchmark_report.json in the store"
    return max(matches, key=lambda p: p.stat().st_mtime)


def test_declared_benchmark_is_built_cached_and_rebuilt_when_its_config_changes(project):
    with ThreadedStubServer() as srv:
        _with(project, _bench(srv.base_url))
        first = build_json(project)
        assert "benchmark:stub" in first["executed"] and "report" in first["executed"] and first["failed"] == []
        report = json.loads(_stored(project, "benchmark:stub").read_text())
        assert report["success"] and report["run"]["completed"] == 4 and report["config"]["goodput"] == {"ttft": 5000}
        assert build_json(project)["executed"] == []  # cached: nothing runs
        _with(project, _bench(srv.base_url, num_prompts=5))
        plan = json.loads(magpie("build", "--dry-run", "--json", cwd=project, check=0).stdout)
        why = {item["task"]: item["why"] for item in plan["would_run"]}
        assert set(why) == {"benchmark:stub", "report"} and why["benchmark:stub"] == "benchmark settings changed"
        assert set(build_json(project)["executed"]) == {"benchmark:stub", "report"}
    md = (project / "workspaces/reports/summary.md").read_text()
    html = (project / "workspaces/reports/report.html").read_text()
    assert "## Serving benchmarks" in md and "| stub | external" in md and "Serving benchmarks" in html
    row = next(line for line in md.splitlines() if line.startswith("| stub "))
    assert "| 5 / 0 | none |" in row


def test_the_port_is_not_part_of_the_key(project):
    with ThreadedStubServer() as srv:
        _with(project, _bench(srv.base_url, extra="port = 1234"))
        build_json(project)
        _with(project, _bench(srv.base_url, extra="port = 4321"))
        assert build_json(project)["executed"] == []


def test_a_failed_benchmark_is_one_line_and_not_stored(project):
    port = free_port()
    _with(project, _bench(f"http://127.0.0.1:{port}", extra="timeout_s = 20"))
    proc = magpie("build", cwd=project)
    assert proc.returncode != 0
    assert "benchmark 'stub' (external tiny) failed:" in proc.stdout + proc.stderr
    assert not list((project / "workspaces" / "store").rglob("benchmark_report.json"))


def test_manifest_errors_name_the_benchmark_field(project):
    _with(project, '\n[[benchmark]]\nid = "x"\nengine = "external"\nmodel = "m"\n')
    proc = magpie("build", "--dry-run", cwd=project)
    assert proc.returncode == 2 and "benchmark[0]" in proc.stderr and "base_url" in proc.stderr
    _with(project, '\n[[benchmark]]\nid = "x"\nengine = "vllm"\nmodel = "m"\n[benchmark.load]\nconcurency = 2\n')
    proc = magpie("build", "--dry-run", cwd=project)
    assert proc.returncode == 2 and "benchmark[0].load.concurency: unknown field" in proc.stderr


def test_model_files_and_engine_version_key_the_benchmark(tmp_path):
    from magpie.graph.expand import expand
    from magpie.graph.rules import builtin_rules
    from magpie.manifest.models import Manifest

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    manifest = Manifest.model_validate({"benchmark": [{"id": "b", "engine": "transformers", "model": "m"}]})
    rules = [r for r in builtin_rules() if r.name == "benchmark"]
    spec = expand(manifest, tmp_path, rules)["benchmark:b"]
    assert spec.inputs == ["m/config.json"] and "engine_version" in spec.config["benchmark"]
    (tmp_path / "m" / "config.json").write_text('{"a": 1}')
    assert expand(manifest, tmp_path, rules)["benchmark:b"].key != spec.key
    hub = Manifest.model_validate({"benchmark": [{"id": "b", "engine": "vllm", "model": "org/name"}]})
    assert expand(hub, tmp_path, rules)["benchmark:b"].inputs == []


def test_real_transformers_serve_build(project, tmp_path_factory, monkeypatch, tiny_model):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    shutil.copytree(tiny_model, project / "models" / "tiny")
    _with(
        project,
        f"""
[[benchmark]]
id = "tiny"
engine = "transformers"
model = "models/tiny"
port = {free_port()}
timeout_s = 240

[benchmark.load]
concurrency = 2
input_len = 8
output_len = 4
num_prompts = 3
""",
    )
    first = build_json(project)
    assert "benchmark:tiny" in first["executed"] and first["failed"] == []
    report = json.loads(_stored(project, "benchmark:tiny").read_text())
    assert report["success"] and report["run"]["total_output_tokens"] == 3 * 4
    assert report["provenance"]["engine_version"]
    assert build_json(project)["executed"] == []
    # the model's content is part of the key: a changed file re-runs the benchmark (and only the serving nodes)
    cfg = project / "models" / "tiny" / "generation_config.json"
    cfg.write_text(cfg.read_text().replace("{", '{\n  "_touched": 1,', 1))
    plan = json.loads(magpie("build", "--dry-run", "--json", cwd=project, check=0).stdout)
    why = {item["task"]: item["why"] for item in plan["would_run"]}
    assert (
        set(why) == {"benchmark:tiny", "report"}
        and "models/tiny/generation_config.json changed" in why["benchmark:tiny"]
    )


def test_a_project_of_benchmarks_alone_builds(tmp_path):
    """A manifest that declares only [[benchmark]] tables is something to build, not 'nothing'."""
    with ThreadedStubServer() as srv:
        (tmp_path / "magpie.toml").write_text('[project]\nname = "serving-only"\n' + _bench(srv.base_url))
        result = build_json(tmp_path)
    assert "benchmark:stub" in result["executed"] and result["failed"] == []
