"""Magpie's `benchmark:` YAML: mapped onto the run config; every mistake one line, exit 2, no traceback."""

import json
import subprocess
import sys
import textwrap

import pytest

from magpie.cli import main
from magpie.errors import UserError
from magpie.serving.bench_config import load_benchmark_config
from magpie.serving.runner import REPORT
from magpie.serving.stub_server import ThreadedStubServer


def _yaml(tmp_path, text: str):
    path = tmp_path / "bench.yaml"
    path.write_text(textwrap.dedent(text))
    return path


FULL = """
    benchmark:
      framework: vllm
      model: meta-llama/Llama-3.1-8B
      precision: bf16
      envs:
        TP: 2
        CONC: 8
        ISL: 512
        OSL: 64
        RANDOM_RANGE_RATIO: 0.5
        NUM_PROMPTS: 40
        MAX_MODEL_LEN: 4096
        EXTRA_VLLM_ARGS: "--enforce-eager --gpu-memory-utilization 0.8"
      env: {VLLM_USE_V1: "1"}
      profiler: {enabled: false}
      run_mode: local
      run_kind: diagnostic
      gpu_selection: [2, 3]
      timeout_seconds: 900
"""


def test_every_field_maps_onto_the_run_config(tmp_path):
    config = load_benchmark_config(_yaml(tmp_path, FULL), output_dir=str(tmp_path / "out"), port=None)
    assert (config.framework, config.model, config.precision, config.tp) == (
        "vllm",
        "meta-llama/Llama-3.1-8B",
        "bf16",
        2,
    )
    assert (config.concurrency, config.input_len, config.output_len, config.num_prompts) == (8, 512, 64, 40)
    assert config.range_ratio == 0.5 and config.max_model_len == 4096 and config.timeout_s == 900
    assert config.extra_server_args == ["--enforce-eager", "--gpu-memory-utilization", "0.8"]
    assert config.env == {"VLLM_USE_V1": "1", "CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"}
    assert config.run_kind == "diagnostic" and config.output_dir == str(tmp_path / "out")


def test_defaults_num_prompts_from_concurrency(tmp_path):
    config = load_benchmark_config(
        _yaml(
            tmp_path,
            """
        benchmark: {framework: sglang, model: m, envs: {CONC: 4, EXTRA_SERVER_ARGS: "--a 1"}}
    """,
        )
    )
    assert config.num_prompts == 40 and config.extra_server_args == ["--a", "1"] and config.env == {}
    assert load_benchmark_config(_yaml(tmp_path, "benchmark: {framework: vllm, model: m}")).num_prompts == 100


@pytest.mark.parametrize(
    "text, expected",
    [
        ("benchmark: {framework: vlm, model: m}", "benchmark.framework: Input should be"),
        ("benchmark: {framework: vllm}", "benchmark.model: required field is missing"),
        (
            "benchmark: {framework: vllm, model: m, envs: {CONCURRENCY: 3}}",
            "benchmark.envs: unknown variable 'CONCURRENCY'",
        ),
        ("benchmark: {framework: vllm, model: m, envs: {TP: 0}}", "benchmark.envs.TP: Input should be greater"),
        (
            "benchmark: {framework: vllm, model: m, envs: {ISL: many}}",
            "benchmark.envs.ISL: Input should be a valid int",
        ),
        (
            "benchmark: {framework: vllm, model: m, envs: {EXTRA_SGLANG_ARGS: x}}",
            "benchmark.envs.EXTRA_SGLANG_ARGS: arguments for sglang, but the framework is vllm",
        ),
        ("benchmark: {framework: vllm, model: m, run_mode: dockr}", "benchmark.run_mode: Input should be"),
        ("benchmark: {framework: vllm, model: m, docker_image: img}", "benchmark: docker_image is docker mode's"),
        ("benchmark: {framework: vllm, model: m, run_kind: clean}", "benchmark.run_kind: Input should be"),
        (
            "benchmark: {framework: vllm, model: m, timeout_seconds: 0}",
            "benchmark.timeout_seconds: Input should be greater",
        ),
        ("benchmark: {framework: vllm, model: m, modle: x}", "benchmark.modle: unknown field"),
        ("kernel: {id: x}", "expected a top-level 'benchmark:' mapping"),
        ("benchmark: [oops", "invalid YAML"),
    ],
)
def test_a_wrong_yaml_is_one_line_naming_file_and_field(tmp_path, text, expected):
    path = _yaml(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_benchmark_config(path)
    message = str(err.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path):
    path = _yaml(tmp_path, "benchmark: {framework: vllm, model: m, envs: {OSL: -1}}")
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", "benchmark", "--benchmark-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: benchmark.envs.OSL:" in lines[0] and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", "benchmark", "vllm", "--benchmark-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_yaml_benchmark_runs_against_a_server(tmp_path, capsys):
    path = _yaml(
        tmp_path,
        """
        benchmark:
          framework: external
          model: tiny
          envs: {CONC: 2, ISL: 4, OSL: 3, NUM_PROMPTS: 6}
          run_kind: diagnostic
          timeout_seconds: 60
    """,
    )
    with ThreadedStubServer() as srv:
        rc = main(["benchmark", "--benchmark-config", str(path), "--base-url", srv.base_url, "-o", str(tmp_path / "o")])
    assert rc == 0, capsys.readouterr()
    report = json.loads((tmp_path / "o" / REPORT).read_text())
    assert report["success"] and report["run"]["completed"] == 6
    assert report["run_kind"] == "diagnostic" and report["reward_eligible"] is False
    assert report["config"]["concurrency"] == 2 and report["config"]["output_len"] == 3
