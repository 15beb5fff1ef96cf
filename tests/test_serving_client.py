"""The load client end to end against a real local streaming HTTP server (`magpie.serving.stub_server`,
an OpenAI-compatible SSE peer with scripted delays, failures and drops): timings bracket the
scripted delays, failures are counted and excluded, the concurrency limit and keep-alive hold."""

import asyncio
import math

import pytest

from magpie.serving import metrics
from magpie.serving.datasets import SampleRequest
from magpie.serving.endpoints import Completions
from magpie.serving.http import Client
from magpie.serving.load import benchmark, run
from magpie.serving.models import DatasetConfig, LoadConfig
from magpie.serving.stub_server import Reply, StubServer, ThreadedStubServer


def config(srv, **kw):
    base = dict(base_url=srv.base_url, model="tiny", num_prompts=12, dataset=DatasetConfig(input_len=8, output_len=6))
    base.update(kw)
    return LoadConfig(**base)


@pytest.mark.parametrize("ep", ["completions", "chat"])
def test_timings_bracket_the_scripted_delays(ep):
    first, gap = 0.030, 0.010
    with ThreadedStubServer(script=lambda p, b: Reply(first_delay=first, delays=[gap] * 10), record=True) as srv:
        m, result, rec = benchmark(
            config(srv, endpoint=ep, max_concurrency=4, num_warmups=2, goodput={"ttft": 1000}), detailed=True
        )
    assert m.completed == 12 and m.failed == 0 and len(rec.warmups) == 2 and all(w.success for w in rec.warmups)
    for out in rec.outputs:
        assert out.output_tokens == 6 and len(out.itl) == 5 and out.generated_text == "tok " * 6
        assert first <= out.ttft < first + 0.25
        # a gap can read shorter than scripted when a late message and the next one arrive in
        # one read (a loaded machine); their sum cannot
        assert sum(out.itl) >= 5 * gap * 0.9 and all(0 <= g < gap + 0.25 for g in out.itl)
        assert out.latency - out.ttft == pytest.approx(sum(out.itl), abs=1e-9)
        assert out.prompt_len == 8  # from the server's usage
    assert m.latency.tpot.median >= gap * 1000 * 0.9 and m.max_concurrent_requests == 4
    assert m.throughput.request_goodput == pytest.approx(m.throughput.request_throughput)
    path, body = srv.requests[-1]
    assert path == ("/v1/chat/completions" if ep == "chat" else "/v1/completions")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body[("max_completion_tokens" if ep == "chat" else "max_tokens")] == 6
    # vLLM's --save-result keys
    for key in (
        "date",
        "backend",
        "endpoint_type",
        "model_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "mean_ttft_ms",
        "median_tpot_ms",
        "std_itl_ms",
        "p99_e2el_ms",
        "p50_ttft_ms",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "start_times",
        "generated_texts",
        "errors",
    ):
        assert key in result, key
    assert result["request_rate"] == "inf" and result["backend"] == ("openai-chat" if ep == "chat" else "openai")
    assert result["p99_ttft_ms"] == m.latency.ttft.p99


def _failing_script(path, body):
    prompt = body.get("prompt", "")
    if "w3" in prompt:
        return Reply(status=500)
    if "w5" in prompt:
        return Reply(drop_after=2, delays=[0.001] * 5)
    if "w7" in prompt:
        return Reply(error_chunk="engine died", tokens=2)
    if "w9" in prompt:
        return Reply(tokens=0)
    return Reply(delays=[0.002] * 5)


def test_failures_are_counted_and_excluded():
    samples = [SampleRequest(f"w{i} x", 2, 4) for i in range(12)]
    with ThreadedStubServer(script=_failing_script) as srv:
        m, result, rec = benchmark(config(srv, num_prompts=12, max_concurrency=3), samples, detailed=True)
    errors = {i: o.error for i, o in enumerate(rec.outputs) if not o.success}
    assert set(errors) == {3, 5, 7}  # w9's empty completion completed, as vLLM counts it
    assert errors[3].startswith("HTTP 500") and "connection closed" in errors[5]
    assert errors[7] == "engine died"
    assert m.completed == 9 and m.failed == 3 and m.empty == 1 and result["output_lens"][3] == 0
    ok = [o for o in rec.outputs if o.success]
    assert m.total_output_tokens == 8 * 4
    assert m.latency.e2el.mean == pytest.approx(sum(o.latency for o in ok) / 9 * 1000)


def test_ready_check_failure_stops_the_run():
    with ThreadedStubServer(script=lambda p, b: Reply(status=503)) as srv:
        with pytest.raises(RuntimeError, match="ready-check request .* failed: HTTP 503"):
            benchmark(config(srv))


def test_unreachable_server_and_timeout_fail_requests():
    cfg = LoadConfig(base_url="http://127.0.0.1:9", model="m", num_prompts=2, ready_check=False)
    m, _, rec = benchmark(cfg)
    assert m.failed == 2 and all("Connection" in o.error or "Errno" in o.error for o in rec.outputs)
    with ThreadedStubServer(script=lambda p, b: Reply(first_delay=5)) as srv:
        m, _, rec = benchmark(config(srv, num_prompts=2, ready_check=False, timeout_s=0.2))
    assert m.failed == 2 and all("timed out after 0.2 s" in o.error for o in rec.outputs)


def test_usage_absent_counts_token_chunks():
    with ThreadedStubServer(script=lambda p, b: Reply(usage=False, tokens=5)) as srv:
        m, _, rec = benchmark(config(srv, num_prompts=3))
    assert all(o.output_tokens == 5 and o.prompt_len == 8 for o in rec.outputs)


def test_rate_paces_the_sends_and_connections_are_reused():
    async def go():
        srv = await StubServer().start()
        try:
            cfg = LoadConfig(
                base_url=srv.base_url,
                model="m",
                num_prompts=40,
                request_rate=200.0,
                burstiness=math.inf,
                dataset=DatasetConfig(input_len=4, output_len=3),
            )
            client = Client(srv.base_url, Completions(), model="m")
            samples = [SampleRequest("a b", 2, 3)] * 40
            rec = await run(cfg, samples, client=client)
            return rec, client.opened, srv.connections
        finally:
            await srv.close()

    rec, opened, served = asyncio.run(go())
    starts = [o.start_time for o in rec.outputs]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 200, rel=0.15)
    assert rec.duration >= 40 / 200 - 0.01
    assert opened == served <= 3  # an instant server: one connection serves them in turn
    m, _ = metrics.compute(rec.outputs, rec.duration)
    assert m.completed == 40 and m.throughput.request_throughput == pytest.approx(40 / rec.duration)


def test_stale_keep_alive_connection_is_retried_once():
    calls = []

    def script(path, body):
        calls.append(path)
        return Reply(abort=len(calls) == 2, tokens=2)  # the second request finds its connection reset

    async def go():
        srv = await StubServer(script=script).start()
        client = Client(srv.base_url, Completions(), model="m")
        first = await client.send("a", 1, 2)
        second = await client.send("a", 1, 2)
        third = await client.send("a", 1, 2)
        await srv.close()
        return first, second, third, client.opened

    first, second, third, opened = asyncio.run(go())
    assert first.success and second.success and third.success
    assert len(calls) == 4 and opened == 2  # one retry, on one fresh connection, then kept alive
