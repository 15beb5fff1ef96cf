"""Engines as command lines (each engine's documented flags), the request body that forces an output length,
the report's keys, the model's content hash, and that `import magpie` and the CLI parser stay light."""

import json
import subprocess
import sys

import pytest

from magpie.serving import engines
from magpie.serving.endpoints import ChatCompletions, Completions
from magpie.serving.engines import ServerSpec, UnsupportedOption
from magpie.serving.report import BenchmarkConfig, BenchmarkReport, local_model_path, model_hash


def cmd(name, **kw):
    return engines.get(name).command(ServerSpec(model="/models/m", **kw))


def test_transformers_command():
    c = cmd("transformers", port=9001, precision="bf16", extra_args="--continuous-batching --log-level info")
    assert c[0].endswith("transformers") or c[1:3] == ["-m", "transformers.cli.transformers"]
    i = c.index("serve")
    assert c[i:] == [
        "serve",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "9001",
        "--dtype",
        "bfloat16",
        "--continuous-batching",
        "--log-level",
        "info",
    ]
    assert "--quantization" in cmd("transformers", precision="int4")
    e = engines.get("transformers")
    assert e.default_port == 8000 and e.health_path == "/health" and e.force_len == "generation_config"
    with pytest.raises(UnsupportedOption, match="tensor parallelism"):
        cmd("transformers", tp=2)
    with pytest.raises(UnsupportedOption, match="fp8"):
        cmd("transformers", precision="fp8")


def test_vllm_command():
    c = cmd("vllm", tp=8, precision="fp16", max_model_len=4096, extra_args=["--enforce-eager"])
    assert c[1:] == [
        "serve",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--dtype",
        "float16",
        "--max-model-len",
        "4096",
        "--enforce-eager",
    ]
    assert cmd("vllm", precision="fp8")[-2:] == ["--quantization", "fp8"]
    assert "--dtype" not in cmd("vllm")
    assert engines.get("vllm").force_len == "ignore_eos"


def test_sglang_command():
    c = cmd("sglang", tp=2, precision="bf16", max_model_len=8192)
    assert c[1:3] == ["-m", "sglang.launch_server"]
    assert c[3:] == [
        "--model-path",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "2",
        "--dtype",
        "bfloat16",
        "--context-length",
        "8192",
    ]
    assert engines.get("sglang").base_url(ServerSpec(model="m", host="0.0.0.0")) == "http://127.0.0.1:30000"


def test_atom_and_external():
    c = cmd("atom", tp=4, max_model_len=2048, port=8888)
    assert c[1:3] == ["-m", "atom.entrypoints.openai_server"]
    assert c[3:] == [
        "--model",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--server-port",
        "8888",
        "-tp",
        "4",
        "--max-model-len",
        "2048",
    ]
    with pytest.raises(UnsupportedOption):
        cmd("atom", precision="fp8")
    with pytest.raises(UnsupportedOption, match="base-url"):
        cmd("external")
    with pytest.raises(ValueError, match="unknown engine"):
        engines.get("tgi")
    with pytest.raises(ValueError, match="unknown precision"):
        ServerSpec(model="m", precision="fp3")


def test_versions():
    assert engines.get("external").version() is None
    assert engines.get("sglang").version() is None or isinstance(engines.get("sglang").version(), str)


def test_forced_length_bodies():
    for ep in (Completions(), ChatCompletions()):
        b = ep.body(
            model="m", prompt="a b", output_len=7, ignore_eos=True, extra_body=None, force_len="generation_config"
        )
        assert "ignore_eos" not in b
        assert json.loads(b["generation_config"]) == {"min_new_tokens": 7, "max_new_tokens": 7}
        b = ep.body(model="m", prompt="a b", output_len=7, ignore_eos=True, extra_body=None)
        assert b["ignore_eos"] is True and "generation_config" not in b
        b = ep.body(
            model="m", prompt="a b", output_len=7, ignore_eos=False, extra_body=None, force_len="generation_config"
        )
        assert "generation_config" not in b and "ignore_eos" not in b


def test_model_hash(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{}")
    (tmp_path / "a" / "w.bin").write_bytes(b"\0" * 10)
    h = model_hash(tmp_path / "a")
    assert h == model_hash(tmp_path / "a") and len(h) == 64
    (tmp_path / "a" / "w.bin").write_bytes(b"\0" * 9 + b"\1")
    assert model_hash(tmp_path / "a") != h
    assert local_model_path(str(tmp_path / "a")) == (tmp_path / "a").resolve()
    assert local_model_path("meta-llama/Llama-3.1-8B") is None
    assert local_model_path("./nowhere") is not None


def test_report_has_magpies_keys(tmp_path):
    r = BenchmarkReport(
        success=False,
        framework="vllm",
        model="m",
        workspace_dir=str(tmp_path),
        execution_time=0.1,
        config=BenchmarkConfig(framework="vllm", model="m"),
    )
    d = r.model_dump(mode="json")
    for key in (
        "success",
        "framework",
        "model",
        "throughput",
        "latency",
        "kernel_summary",
        "top_bottlenecks",
        "tracelens_analysis",
        "gap_analysis",
        "gpu_monitor",
        "workspace_dir",
        "execution_time",
        "profiling_enabled",
        "run_kind",
        "reward_eligible",
        "errors",
    ):
        assert key in d
    assert d["top_bottlenecks"] == [] and d["run_kind"] == "measurement" and d["reward_eligible"] is False


def test_import_stays_light():
    code = (
        "import sys, magpie, magpie.cli; magpie.cli.parser(); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'numpy', 'fastapi') "
        "or m.startswith('magpie.serving')]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
