"""Magpie's YAML profiler block (issue 40.4) and the tokenizer / prefix length in the YAML and in `[[benchmark]]`
tables (issue 40.1): `profiler: {torch_profiler, tracelens: {analysis_mode}}` as Magpie's benchmark schema has it,
mapped onto magpie's profiled run and trace analysis mode; every key or value magpie has no counterpart for is one
line naming the file and the field; `tokenizer` / `random_prefix_len` (YAML) and `load.tokenizer` /
`load.prefix_len` (magpie.toml) reach the run's config as `--tokenizer` / `--random-prefix-len` do, and key the
declared benchmark."""

import json
import os
from pathlib import Path

import pytest
from conftest import magpie

from magpie.errors import UserError
from magpie.serving.bench_config import load_benchmark_config


def _yaml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text("benchmark:\n  framework: vllm\n  model: m\n" + body)
    return path


MAGPIE_BLOCK = """  profiler:
    torch_profiler:
      enabled: true
    system_profiler:
      enabled: false
    tracelens:
      enabled: true
      analysis_mode: {mode}
      analysis_stages: all
      auto_patch_runtime: true
      export_format: csv
      perf_report_enabled: true
      multi_rank_report_enabled: true
"""


@pytest.mark.parametrize("mode", ["inference", "pytorch"])
def test_magpies_block_profiles_and_sets_the_analysis_mode(tmp_path, mode):
    config = load_benchmark_config(_yaml(tmp_path, MAGPIE_BLOCK.format(mode=mode)))
    assert config.profiler and config.run_kind == "diagnostic" and config.analysis_mode == mode


def test_torch_profiler_without_tracelens_keeps_the_traces_unanalysed(tmp_path):
    config = load_benchmark_config(_yaml(tmp_path, "  profiler:\n    torch_profiler: {enabled: true}\n"))
    assert config.profiler and config.analysis_mode is None
    off = load_benchmark_config(
        _yaml(tmp_path, "  profiler:\n    torch_profiler: {enabled: false}\n    tracelens: {enabled: false}\n")
    )
    assert not off.profiler and off.run_kind == "measurement"


def test_magpies_own_switch_and_the_cli_flag_analyse_in_inference_mode(tmp_path):
    assert load_benchmark_config(_yaml(tmp_path, "  profiler: true\n")).analysis_mode == "inference"
    flagged = load_benchmark_config(_yaml(tmp_path, ""), profiler=True)
    assert flagged.profiler and flagged.analysis_mode == "inference"


def test_the_gpu_monitor_interval_is_the_monitors(tmp_path):
    config = load_benchmark_config(_yaml(tmp_path, "  profiler:\n    gpu_monitor: {interval_sec: 2.5}\n"))
    assert config.gpu_monitor_interval_s == 2.5 and not config.profiler


@pytest.mark.parametrize(
    "body, field, words",
    [
        (
            "  profiler:\n    torch_profiler: {enabled: true}\n    tracelens: {analysis_mode: decode}\n",
            "benchmark.profiler.tracelens.analysis_mode",
            "'inference' or 'pytorch'",
        ),
        ("  profiler:\n    torch_profilr: {enabled: true}\n", "benchmark.profiler.torch_profilr", "unknown field"),
        (
            "  profiler:\n    tracelens: {enabled: true, colour: red}\n",
            "benchmark.profiler.tracelens.colour",
            "unknown field",
        ),
        (
            "  profiler:\n    torch_profiler: {enabled: yes please}\n",
            "benchmark.profiler.torch_profiler.enabled",
            "valid boolean",
        ),
        (
            "  profiler:\n    tracelens: {enabled: true}\n",
            "benchmark.profiler",
            "set torch_profiler.enabled: true or tracelens.enabled: false",
        ),
        ("  profiler:\n    enabled: true\n    torch_profiler: {enabled: true}\n", "benchmark.profiler", "not both"),
        (
            "  profiler:\n    torch_profiler: {}\n    tracelens: {enabled: true, export_format: excel}\n",
            "benchmark.profiler.tracelens",
            "export_format: 'excel' is not supported: magpie writes CSV tables; set export_format: csv or remove it",
        ),
        (
            "  profiler:\n    system_profiler: {enabled: true}\n",
            "benchmark.profiler.system_profiler",
            "set enabled: false or remove it",
        ),
        ("  profiler: sometimes\n", "benchmark.profiler", "valid dictionary"),
    ],
)
def test_a_bad_profiler_block_is_one_line_naming_file_and_field(tmp_path, body, field, words):
    path = _yaml(tmp_path, body)
    with pytest.raises(UserError) as err:
        load_benchmark_config(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: {field}:") and words in line, line


def test_the_cli_gives_the_error_line_and_exit_2(tmp_path):
    path = _yaml(tmp_path, "  profiler:\n    tracelens: {enabled: true, analysis_mode: fast}\n")
    proc = magpie("benchmark", "--benchmark-config", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}: benchmark.profiler.tracelens.analysis_mode:" in proc.stderr


def test_tokenizer_and_prefix_from_the_yaml(tmp_path):
    (tmp_path / "tok").mkdir()
    config = load_benchmark_config(_yaml(tmp_path, "  tokenizer: ./tok\n  random_prefix_len: 16\n"))
    assert config.tokenizer == str((tmp_path / "tok").resolve()) and config.prefix_len == 16
    hub = load_benchmark_config(_yaml(tmp_path, "  tokenizer: org/tok\n"), tokenizer="other/tok", prefix_len=4)
    assert hub.tokenizer == "other/tok" and hub.prefix_len == 4  # the CLI's flags win
    with pytest.raises(UserError, match=r"bench.yaml: benchmark.random_prefix_len: .*greater than or equal to 0"):
        load_benchmark_config(_yaml(tmp_path, "  random_prefix_len: -1\n"))
    with pytest.raises(UserError, match=r"bench.yaml: benchmark.tokenizer: .*at least 1 character"):
        load_benchmark_config(_yaml(tmp_path, "  tokenizer: ''\n"))


def _manifest(**load):
    from magpie.manifest.models import Manifest

    return Manifest.model_validate({"benchmark": [{"id": "b", "engine": "vllm", "model": "org/m", "load": load}]})


def test_tokenizer_and_prefix_in_a_benchmark_table_reach_the_run_and_its_key(tmp_path):
    from magpie.graph.expand import expand
    from magpie.graph.rules import builtin_rules
    from magpie.serving.build_rule import config_of

    (tmp_path / "tok").mkdir()
    rules = [r for r in builtin_rules() if r.name == "benchmark"]
    plain = expand(_manifest(), tmp_path, rules)["benchmark:b"]
    prefixed = expand(_manifest(prefix_len=32), tmp_path, rules)["benchmark:b"]
    tokenized = expand(_manifest(tokenizer="tok"), tmp_path, rules)["benchmark:b"]
    other = expand(_manifest(tokenizer="org/tok"), tmp_path, rules)["benchmark:b"]
    assert len({plain.key, prefixed.key, tokenized.key, other.key}) == 4
    config = config_of(tokenized.params["benchmark"], tmp_path, tmp_path / "out")
    assert config.tokenizer == str((tmp_path / "tok").resolve()) and config.prefix_len == 0
    assert config_of(prefixed.params["benchmark"], tmp_path, tmp_path / "out").prefix_len == 32


def test_a_bad_tokenizer_or_prefix_in_a_benchmark_table_is_one_line(tmp_path):
    (tmp_path / "magpie.toml").write_text(
        '[[benchmark]]\nid = "b"\nengine = "vllm"\nmodel = "org/m"\n[benchmark.load]\nprefix_len = -3\n'
    )
    proc = magpie("build", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "benchmark[0].load.prefix_len: Input should be greater than or equal to 0" in proc.stderr


@pytest.mark.parametrize("mode", ["inference", "pytorch"])
def test_the_analysis_runs_in_the_mode_given(tmp_path, mode):
    import shutil

    from magpie.serving import profiling

    traces = tmp_path / "torch_trace"
    traces.mkdir()
    shutil.copy(Path(__file__).parent / "fixtures/traces/h200/fp8_scaled_mm.json.gz", traces)
    fields = profiling.analyse(traces, tmp_path / "work", mode)
    assert fields["tracelens_analysis"]["analysis_mode"] == mode


def test_the_yamls_tokenizer_and_prefix_shape_the_prompts_sent(tmp_path):
    from magpie.serving.runner import RESULT, run_benchmark
    from magpie.serving.stub_server import ThreadedStubServer
    from magpie.serving.tiny_model import train_tokenizer

    tokenizer = train_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    with ThreadedStubServer(record=True) as srv:
        path = _yaml(
            tmp_path,
            f"  base_url: {srv.base_url}\n  tokenizer: ./tok\n  random_prefix_len: 4\n"
            "  envs: {CONC: 2, ISL: 8, OSL: 3, NUM_PROMPTS: 4}\n",
        )
        path.write_text(path.read_text().replace("framework: vllm", "framework: external"))
        report = run_benchmark(load_benchmark_config(path, output_dir=str(tmp_path / "ws")))
        prompts = [body["prompt"] for route, body in srv.requests if route == "/v1/completions"][-4:]
    assert report.success and report.config.tokenizer == str((tmp_path / "tok").resolve())
    assert json.loads((tmp_path / "ws" / RESULT).read_text())["tokenizer_id"] == report.config.tokenizer
    assert [len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts] == [12] * 4
    shared = os.path.commonprefix(prompts)
    assert len(tokenizer.encode(shared, add_special_tokens=False)) >= 2  # the prefix, but for its last merges


def test_magpies_block_profiles_transformers_serve_and_analyses_in_pytorch_mode(tiny_model, tmp_path):
    from magpie.cli import main
    from magpie.serving.local import free_port
    from magpie.serving.runner import REPORT

    path = tmp_path / "bench.yaml"
    path.write_text(
        f"benchmark:\n  framework: transformers\n  model: {tiny_model}\n  timeout_seconds: 240\n"
        "  envs: {CONC: 2, ISL: 16, OSL: 8, NUM_PROMPTS: 4}\n" + MAGPIE_BLOCK.format(mode="pytorch")
    )
    out = tmp_path / "ws"
    rc = main(["benchmark", "--benchmark-config", str(path), "--port", str(free_port()), "-o", str(out)])
    report = json.loads((out / REPORT).read_text())
    assert rc == 0 and report["success"], report["errors"]
    assert report["profiling_enabled"] and report["run_kind"] == "diagnostic"
    assert report["config"]["analysis_mode"] == "pytorch" and report["tracelens_analysis"]["analysis_mode"] == "pytorch"
    assert report["tracelens_analysis"]["per_stage"] == {}  # no step / stage split in pytorch mode
