"""A real engine end to end, offline: `transformers serve` on the CPU serving a tiny random-weight Llama-style model
with a tokenizer trained here (magpie.serving.tiny_model; HF_HUB_OFFLINE=1, nothing downloaded), benchmarked through
`magpie benchmark transformers`; and the engine failing to start on a broken model. Needs `transformers[serving]`
(.ci/run installs it): without it these tests fail, they are not skipped."""

import json
import re

import pytest

from magpie.cli import main
from magpie.serving.local import free_port, group_alive
from magpie.serving.report import model_hash
from magpie.serving.runner import REPORT, RESULT


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_transformers_serve_end_to_end(tiny_model, tmp_path, endpoint):
    import transformers

    out = tmp_path / "ws"
    rc = main(
        [
            "benchmark",
            "transformers",
            "-m",
            str(tiny_model),
            "--port",
            str(free_port()),
            "--endpoint",
            endpoint,
            "--num-prompts",
            "6",
            "--concurrency",
            "3",
            "--input-len",
            "16",
            "--output-len",
            "12",
            "--num-warmups",
            "1",
            "--timeout",
            "240",
            "-o",
            str(out),
        ]
    )
    report = json.loads((out / REPORT).read_text())
    assert rc == 0, report["errors"]
    assert report["success"] and report["errors"] == [] and report["framework"] == "transformers"
    assert report["run"]["completed"] == 6 and report["run"]["failed"] == 0
    assert report["run"]["total_output_tokens"] == 6 * 12  # the forced length, from usage
    assert report["run"]["total_input_tokens"] >= 6 * 16  # the server's prompt token counts
    lat = report["latency"]
    assert 0 < lat["ttft"]["mean_ms"] <= lat["e2el"]["mean_ms"]
    assert lat["tpot"]["mean_ms"] > 0 and lat["itl"]["p99_ms"] > 0
    assert report["throughput"]["output_throughput"] > 0
    prov = report["provenance"]
    assert prov["engine_version"] == transformers.__version__ and prov["model_path"] == str(tiny_model.resolve())
    assert prov["model_hash"] == model_hash(tiny_model) and prov["environment"]["HF_HUB_OFFLINE"] == "1"
    vllm = json.loads((out / RESULT).read_text())
    assert vllm["completed"] == 6 and vllm["total_output_tokens"] == 72
    assert vllm["backend"] == ("openai-chat" if endpoint == "chat" else "openai")
    log = (out / "server.log").read_text()
    statuses = re.findall(r'"POST /v1/\S+ HTTP/[\d.]+" (\d{3})', log)
    assert statuses and set(statuses) == {"200"}, statuses  # no request the server refused (422 etc.)
    assert report["server"]["ready_after_s"] > 0 and not group_alive(report["server"]["pid"])


def test_transformers_serve_fails_to_start(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": "wide"}')
    rc = main(
        [
            "benchmark",
            "transformers",
            "-m",
            str(broken),
            "--port",
            str(free_port()),
            "--num-prompts",
            "2",
            "--timeout",
            "120",
            "-o",
            str(tmp_path / "ws"),
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("magpie: benchmark failed: the server exited with code 1 before")
    report = json.loads((tmp_path / "ws" / REPORT).read_text())
    assert not report["success"] and "hidden_size" in report["errors"][1]
    assert not group_alive(report["server"]["pid"])
