"""Success as vLLM's `bench serve` counts it (issue 40.3): a request whose stream answered without an error is
completed even with no output text, and the run says how many were empty. vLLM (`endpoint_request_func.py`)
marks a request successful once a chunk with a choice arrived, whatever its text, and counts every successful
request in `completed`; magpie counted such a request failed and the run unsuccessful."""

import itertools
import json
from pathlib import Path

import pytest

from magpie.serving import metrics
from magpie.serving.endpoints import ChatCompletions, Completions
from magpie.serving.report import BenchmarkConfig
from magpie.serving.runner import REPORT, RESULT, run_benchmark
from magpie.serving.stream import RequestOutput, StreamRecorder
from magpie.serving.stub_server import Reply, ThreadedStubServer


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def feed(endpoint, messages, times, start=0.0) -> RequestOutput:
    clock = iter(times)
    rec = StreamRecorder(endpoint, RequestOutput(5, start), lambda: next(clock))
    for m in messages:
        rec.feed(m)
    return rec.finish()


def test_an_empty_chat_completion_is_a_success_timed_by_its_chunks():
    out = feed(
        ChatCompletions(),
        [
            sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
            sse({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
            sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}}),
            sse(b"[DONE]"),
        ],
        [1.0, 1.5, 1.75, 2.0],
        start=0.5,
    )
    assert out.success and out.error == "" and out.generated_text == "" and out.output_tokens == 0
    assert (out.ttft, out.latency, out.itl) == (0.5, 1.25, [])


def test_a_completion_of_only_the_end_token_is_a_success_with_its_usage_count():
    out = feed(
        Completions(),
        [sse({"choices": [{"text": "", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}), sse(b"[DONE]")],
        [3.0, 3.0],
    )
    assert out.success and out.output_tokens == 1 and out.ttft == out.latency == 3.0


@pytest.mark.parametrize("messages", [[sse(b"[DONE]")], [sse({"error": {"message": "engine died"}}), sse(b"[DONE]")]])
def test_a_stream_with_no_chunk_or_an_error_still_fails(messages):
    out = feed(Completions(), messages, [1.0] * len(messages))
    assert not out.success and out.error


def test_metrics_count_empty_requests_as_completed():
    text = feed(Completions(), [sse({"choices": [{"text": "a"}]}), sse({"choices": [{"text": "b"}]})], [1.0, 2.0])
    empty = feed(Completions(), [sse({"choices": [{"text": ""}]})], [1.5])
    failed = feed(Completions(), [sse(b"[DONE]")], [1.0])
    m, _ = metrics.compute([text, empty, failed], 2.0)
    assert (m.completed, m.failed, m.empty) == (2, 1, 1)
    assert m.total_output_tokens == 2 and m.latency.ttft.mean == pytest.approx(1250.0)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """A run in which every third request (after the ready check) is answered with no token at all."""
    calls = itertools.count()

    def script(path, body):
        return Reply(tokens=0) if next(calls) % 3 == 1 else Reply()

    out = tmp_path_factory.mktemp("mixed")
    with ThreadedStubServer(script=script) as srv:
        report = run_benchmark(
            BenchmarkConfig(
                framework="vllm",
                model="tiny",
                base_url=srv.base_url,
                num_prompts=6,
                input_len=4,
                output_len=3,
                concurrency=2,
                output_dir=str(out),
            )
        )
    return report, out


def test_a_run_with_empty_completions_succeeds_and_counts_them(mixed_run):
    report, out = mixed_run
    assert report.success and report.errors == []
    assert (report.run.completed, report.run.failed, report.run.empty) == (6, 0, 2)
    assert report.run.total_output_tokens == 4 * 3
    saved = json.loads((out / REPORT).read_text())
    assert saved["run"]["empty"] == 2
    result = json.loads((Path(out) / RESULT).read_text())
    assert (result["completed"], result["failed"], result["empty"]) == (6, 0, 2)
