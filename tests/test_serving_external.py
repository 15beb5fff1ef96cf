"""Any OpenAI-compatible server (issue 40.6): `magpie benchmark --base-url URL` (engine `external`, the default
with --base-url) sends OpenAI's standard request fields alone — no engine's extension such as vLLM's `ignore_eos`
or transformers' `generation_config`, which servers outside those engines refuse (`transformers serve`: HTTP 422).
The peer is the stub SSE server recording each request body (a test double for the network peer only); naming an
engine with --base-url keeps that engine's way of fixing the output length."""

import json

import pytest

from magpie.cli import main
from magpie.serving.runner import REPORT
from magpie.serving.stub_server import Reply, ThreadedStubServer

# The request fields of OpenAI's API reference (Completions and Chat Completions, create), written down as data.
OPENAI_FIELDS = {
    "completions": {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    },
    "chat": {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
    },
}


def _run(tmp_path, engine: list[str], endpoint: str) -> tuple[int, list[dict]]:
    bodies = []

    def script(path, body):
        bodies.append(body)
        return Reply()

    with ThreadedStubServer(script=script) as stub:
        code = main(
            [
                "benchmark",
                *engine,
                "-m",
                "tiny",
                "--base-url",
                stub.base_url,
                "--endpoint",
                endpoint,
                "--num-prompts",
                "4",
                "--input-len",
                "4",
                "--output-len",
                "3",
                "--num-warmups",
                "1",
                "-o",
                str(tmp_path),
            ]
        )
    return code, bodies


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("engine", [[], ["external"]], ids=["no-engine", "external"])
def test_base_url_sends_only_openais_standard_fields(tmp_path, engine, endpoint, capsys):
    code, bodies = _run(tmp_path, engine, endpoint)
    assert code == 0, capsys.readouterr().err
    assert len(bodies) >= 5  # the warm-up and the four measured requests
    for body in bodies:
        assert set(body) <= OPENAI_FIELDS[endpoint], sorted(set(body) - OPENAI_FIELDS[endpoint])
        assert body["stream"] is True and body["model"] == "tiny"
    report = json.loads((tmp_path / REPORT).read_text())
    assert report["success"] and report["framework"] == "external" and report["server"]["mode"] == "external"


def test_a_named_engine_at_a_base_url_keeps_its_way_of_fixing_the_length(tmp_path):
    code, bodies = _run(tmp_path, ["vllm"], "completions")
    assert code == 0 and all(body.get("ignore_eos") is True for body in bodies)
