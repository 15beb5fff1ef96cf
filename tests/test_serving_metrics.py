"""The load client's arithmetic on the CPU: SSE streams → records (scripted clock), records → metrics
(against a direct computation), arrivals, datasets, config and HTTP framing. No network."""

import json
import math
import statistics
import subprocess
import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from magpie.serving import metrics
from magpie.serving.datasets import (
    SampleRequest,
    custom_dataset,
    length_range,
    random_dataset,
    sharegpt_dataset,
    vocabulary,
)
from magpie.serving.endpoints import ChatCompletions, Completions, endpoint
from magpie.serving.http import _Connection
from magpie.serving.load import arrival_offsets
from magpie.serving.models import DatasetConfig, LoadConfig, parse_goodput
from magpie.serving.stream import RequestOutput, StreamRecorder


class ScriptedClock:
    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.times.pop(0)


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chat_stream(texts, usage=None):
    msgs = [sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    msgs += [sse({"choices": [{"index": 0, "delta": {"content": t}}]}) for t in texts]
    msgs.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    if usage is not None:
        msgs.append(sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": usage}}))
    msgs.append(sse(b"[DONE]"))
    return msgs


def completion_stream(texts, usage=None):
    msgs = [sse({"choices": [{"index": 0, "text": t}]}) for t in texts]
    if usage is not None:
        msgs.append(sse({"choices": [], "usage": {"completion_tokens": usage}}))
    msgs.append(sse(b"[DONE]"))
    return msgs


def record(ep, msgs, times, *, cuts=None, start=0.0):
    """Feeds the messages (or, given cuts, their bytes re-cut at those offsets) with one scripted time per message."""
    clock = ScriptedClock(times)
    rec = StreamRecorder(ep, RequestOutput(3, start), clock)
    data = b"".join(msgs)
    if cuts is None:
        for m in msgs:
            rec.feed(m)
    else:
        cuts = sorted(c for c in set(cuts) if 0 < c < len(data))
        for a, b in zip([0] + cuts, cuts + [len(data)]):
            rec.feed(data[a:b])
    assert clock.calls == len(msgs) and not clock.times
    return rec.finish()


def test_scripted_clock_chat_stream():
    # send at 1.0; role chunk 1.1, tokens 1.25 1.30 1.45, finish chunk 1.5, usage 1.55, [DONE] 1.6
    msgs = chat_stream(["a", "b", "c"], usage=5)
    out = record(ChatCompletions(), msgs, [1.1, 1.25, 1.30, 1.45, 1.5, 1.55, 1.6], start=1.0)
    assert out.success and out.generated_text == "abc"
    assert out.ttft == pytest.approx(0.25)  # the role-only chunk is not a token
    assert out.latency == pytest.approx(0.45)  # nor are the finish and usage chunks
    assert out.itl == pytest.approx([0.05, 0.15])
    assert out.output_tokens == 5 and out.prompt_len == 7  # from usage
    assert metrics.tpot(out) == pytest.approx(0.2 / 4)


def test_scripted_clock_completions_without_usage_counts_chunks_and_crlf_comments():
    msgs = [
        b": ping\r\n\r\n",
        b"data: " + json.dumps({"choices": [{"text": "x"}]}).encode() + b"\r\n\r\n",
        b"event: x\r\ndata: " + json.dumps({"choices": [{"text": ""}]}).encode() + b"\r\n\r\n",
        b"data: " + json.dumps({"choices": [{"text": "y"}]}).encode() + b"\r\n\r\n",
        b"data: [DONE]\r\n\r\n",
    ]
    clock = ScriptedClock([0.5, 0.6, 0.9, 1.0])  # the comment-only message takes no time stamp
    rec = StreamRecorder(Completions(), RequestOutput(0, 0.0), clock)
    data = b"".join(msgs)
    for i in range(len(data)):  # one byte at a time: CRLF split across feeds
        rec.feed(data[i : i + 1])
    out = rec.finish()
    assert out.success and out.output_tokens == 2 and out.generated_text == "xy"
    assert (out.ttft, out.latency) == (0.5, 0.9) and out.itl == pytest.approx([0.4])


def test_stream_without_a_chunk_or_with_error_fails():
    out = record(ChatCompletions(), [sse(b"[DONE]")], [1])
    assert not out.success and "no chunk arrived" in out.error
    rec = StreamRecorder(Completions(), RequestOutput(), ScriptedClock([1, 2]))
    rec.feed(sse({"choices": [{"text": "a"}]}) + sse({"error": {"message": "engine died"}}))
    out = rec.finish()
    assert not out.success and out.error == "engine died"


@settings(max_examples=300)
@given(
    n=st.integers(1, 40),
    chat=st.booleans(),
    usage_over=st.one_of(st.none(), st.integers(0, 5)),
    start=st.floats(0, 100),
    data=st.data(),
)
def test_property_e2el_minus_ttft_is_sum_of_itl(n, chat, usage_over, start, data):
    """Any stream, its bytes cut anywhere, its messages arriving at any times after the send."""
    usage = None if usage_over is None else n + usage_over
    texts = [f"t{i} " for i in range(n)]
    msgs = chat_stream(texts, usage) if chat else completion_stream(texts, usage)
    gaps = data.draw(st.lists(st.floats(0, 1), min_size=len(msgs), max_size=len(msgs)), label="gaps")
    times = [start + sum(gaps[: i + 1]) for i in range(len(msgs))]
    cuts = data.draw(st.lists(st.integers(1, len(b"".join(msgs)) - 1), max_size=12), label="cuts")
    token_idx = [i for i in range(len(msgs)) if (1 <= i <= n if chat else i < n)]
    out = record(ChatCompletions() if chat else Completions(), msgs, times, cuts=cuts, start=start)
    token_times = [times[i] for i in token_idx]
    assert out.success
    assert out.latency - out.ttft == pytest.approx(sum(out.itl), abs=1e-9)
    assert out.ttft == token_times[0] - start and out.latency == token_times[-1] - start
    assert len(out.itl) == n - 1
    assert out.output_tokens == (usage or n)


def _linear_percentile(values, p):
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@st.composite
def recorded_output(draw, failed: bool) -> RequestOutput:
    n = draw(st.integers(1, 20))
    start = draw(st.floats(0, 3))
    msgs = completion_stream(["w"] * n, usage=draw(st.sampled_from([None, n])))
    times = sorted(start + t for t in draw(st.lists(st.floats(0.001, 2), min_size=len(msgs), max_size=len(msgs))))
    out = record(Completions(), msgs, times, start=start)
    out.prompt_len = draw(st.integers(1, 50))
    if failed:  # a failure carrying misleading numbers
        out.success, out.error, out.ttft, out.latency, out.itl = False, "HTTP 500", 99.0, 99.0, [42.0]
    return out


@settings(max_examples=25)
@given(
    succeeded=st.lists(recorded_output(failed=False), min_size=1, max_size=60),
    failed=st.lists(recorded_output(failed=True), min_size=1, max_size=10),
    data=st.data(),
)
def test_metrics_equal_a_direct_computation(succeeded, failed, data):
    assume(any(o.output_tokens > 1 for o in succeeded))  # else no request has a time per output token
    outs = data.draw(st.permutations(succeeded + failed), label="outputs")
    ok = [o for o in outs if o.success]
    duration = 7.5
    m, flat = metrics.compute(outs, duration, goodput={"ttft": 800, "tpot": 150})
    ttft = [o.ttft * 1000 for o in ok]
    e2el = [o.latency * 1000 for o in ok]
    tpot = [(o.latency - o.ttft) / (o.output_tokens - 1) * 1000 for o in ok if o.output_tokens > 1]
    itl = [g * 1000 for o in ok for g in o.itl]
    for name, values in {"ttft": ttft, "e2el": e2el, "tpot": tpot, "itl": itl}.items():
        stats = getattr(m.latency, name)
        assert stats.mean == pytest.approx(statistics.fmean(values))
        assert stats.median == pytest.approx(statistics.median(values))
        assert stats.std == pytest.approx(statistics.pstdev(values))
        for p in (50, 90, 95, 99):
            assert getattr(stats, f"p{p}") == pytest.approx(_linear_percentile(values, p))
            assert flat[f"p{p}_{name}_ms"] == getattr(stats, f"p{p}")
    assert 42000.0 not in itl and m.failed == len(outs) - len(ok) > 0 and m.completed == len(ok)
    assert m.total_output_tokens == sum(o.output_tokens for o in ok)
    assert m.throughput.request_throughput == pytest.approx(len(ok) / duration)
    assert m.throughput.output_throughput == pytest.approx(sum(o.output_tokens for o in ok) / duration)
    assert m.throughput.total_token_throughput == pytest.approx(
        sum(o.output_tokens + o.prompt_len for o in ok) / duration
    )
    good = sum(1 for o in ok if o.ttft <= 0.8 and metrics.tpot(o) <= 0.15)
    assert m.throughput.request_goodput == pytest.approx(good / duration)
    # peak concurrency by brute force over every start instant
    peak = max(sum(1 for q in ok if q.start_time <= o.start_time < q.start_time + q.latency) for o in ok)
    assert m.max_concurrent_requests == peak


def test_all_failed_and_empty_read_zero():
    bad = RequestOutput()
    bad.error = "refused"
    m, flat = metrics.compute([bad], 1.0)
    assert m.completed == 0 and m.failed == 1 and m.latency.ttft.p99 == 0.0 and m.throughput.request_goodput is None


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0, math.inf])
def test_arrivals_rescaled_so_the_last_send_is_at_n_over_rate(burstiness):
    n, rate = 4000, 250.0
    offsets = arrival_offsets(n, rate, burstiness, seed=3)
    assert len(offsets) == n and offsets[-1] == pytest.approx(n / rate)
    gaps = [b - a for a, b in zip([0.0] + offsets, offsets)]
    assert min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(1 / rate)
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)  # gamma(k): CV = 1/sqrt(k)
    assert cv == pytest.approx(0.0 if math.isinf(burstiness) else 1 / math.sqrt(burstiness), abs=0.06)
    assert arrival_offsets(n, rate, burstiness, seed=3) == offsets
    if math.isinf(burstiness):
        assert offsets[:3] == pytest.approx([1 / rate, 2 / rate, 3 / rate])


def test_arrivals_at_infinite_rate_are_all_at_once():
    assert arrival_offsets(5, math.inf, 0.5) == [0.0] * 5
    with pytest.raises(ValueError):
        arrival_offsets(5, 10.0, 0.0)


def test_random_dataset_lengths_and_vocabulary():
    vocab = vocabulary()
    assert len(vocab) == len(set(vocab)) == 10000 and all(w.isalpha() and w.islower() for w in vocab)
    samples = random_dataset(500, 100, 20, range_ratio=0.5, seed=1)
    assert {s.prompt_len for s in samples} <= set(range(50, 151)) and len({s.prompt_len for s in samples}) > 50
    assert all(10 <= s.expected_output_len <= 30 for s in samples)
    assert all(len(s.prompt.split()) == s.prompt_len for s in samples)
    assert random_dataset(5, 10, 4, seed=2) == random_dataset(5, 10, 4, seed=2)
    fixed = random_dataset(5, 10, 4, prefix_len=3, seed=2)
    assert len({s.prompt.split()[:3].__str__() for s in fixed}) == 1 and all(s.prompt_len == 13 for s in fixed)
    assert length_range(10, 0.0) == (10, 10)
    with pytest.raises(ValueError):
        length_range(10, 1.0)


class CharTokenizer:
    """One token per character over a 65-character alphabet: a stand-in for a real tokenizer."""

    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,"
    vocab_size = len(alphabet)
    all_special_ids = [64]  # ","

    def encode(self, text, add_special_tokens=False):
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)


def test_random_dataset_with_a_tokenizer():
    samples = random_dataset(20, 30, 5, seed=0, tokenizer=CharTokenizer())
    assert all(len(s.prompt) == 30 == s.prompt_len and "," not in s.prompt for s in samples)


def test_sharegpt_and_custom(tmp_path):
    convs = [
        {
            "conversations": [
                {"from": "human", "value": "one two three four five"},
                {"from": "gpt", "value": "a b c d e f"},
            ]
        },
        {"conversations": [{"from": "human", "value": "too short"}, {"from": "gpt", "value": "a b c d"}]},
        {"conversations": [{"from": "human", "value": "only one turn here"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    assert sharegpt_dataset(path, 3) == [SampleRequest("one two three four five", 5, 6)] * 3
    assert sharegpt_dataset(path, 1, output_len=9)[0].expected_output_len == 9
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"prompt": "hello there"}\n\n{"prompt": "x", "output_tokens": 3}\n')
    assert custom_dataset(jl, 2) == [SampleRequest("hello there", 2, 256), SampleRequest("x", 1, 3)]
    assert custom_dataset(jl, 2, output_len=4)[1].expected_output_len == 4
    jl.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:1: each line needs a string \"prompt\""):
        custom_dataset(jl, 1)


def test_config_and_goodput_parsing():
    assert parse_goodput(["ttft:100", "e2el:2.5"]) == {"ttft": 100.0, "e2el": 2.5}
    for bad in (["itl:3"], ["ttft"], ["ttft:x"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    c = LoadConfig(model="m", request_rate=5, goodput={"tpot": 20})
    assert c.dataset.name == "random" and c.burstiness == 1.0 and math.isinf(LoadConfig(model="m").request_rate)
    for bad in (
        {"burstiness": 0},
        {"goodput": {"itl": 1}},
        {"goodput": {"ttft": -1}},
        {"rate": 3},
        {"dataset": {"name": "custom"}},
        {"dataset": {"name": "random", "path": "x"}},
    ):
        with pytest.raises(ValueError):
            LoadConfig(model="m", **bad)
    with pytest.raises(ValueError, match="unknown endpoint"):
        endpoint("embeddings")
    assert DatasetConfig(name="sharegpt", path="x").path == "x"


def test_request_bodies():
    chat = ChatCompletions().body(model="m", prompt="hi", output_len=4, ignore_eos=True, extra_body={"temperature": 0})
    assert chat == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }
    comp = Completions().body(model="m", prompt="hi", output_len=4, ignore_eos=False, extra_body=None)
    assert comp["max_tokens"] == 4 and "ignore_eos" not in comp and comp["stream_options"] == {"include_usage": True}


class _Transport:
    def __init__(self):
        self.closed = False
        self.written = b""

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    abort = close

    def is_closing(self):
        return self.closed


class _Waiter:
    def __init__(self):
        self.result = None

    def done(self):
        return self.result is not None

    def set_result(self, value):
        self.result = value


def _response(body_msgs, *, chunked=True, status=200, extra=b""):
    body = b"".join(body_msgs)
    if chunked:
        framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(m), m) for m in body_msgs) + b"0\r\nX-Trailer: 1\r\n\r\n"
        head = b"HTTP/1.1 %d OK\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (status, extra)
        return head + framed
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n" % (status, len(body), extra) + body


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_http_framing_at_any_byte_boundary(chunked, step):
    msgs = completion_stream(["a", "b", "c"], usage=3)
    data = _response(msgs, chunked=chunked)
    conn = _Connection()
    conn.connection_made(_Transport())
    out = RequestOutput()
    waiter = _Waiter()
    conn.start(b"req", StreamRecorder(Completions(), out, iter(range(1, 100)).__next__), waiter)
    for i in range(0, len(data), step):
        conn.data_received(data[i : i + step])
    assert waiter.result == "" and conn._state == 0 and not conn.closed
    assert out.token_times == [1, 2, 3] and out.usage_tokens == 3


def test_http_error_status_and_close():
    conn = _Connection()
    conn.connection_made(_Transport())
    waiter = _Waiter()
    conn.start(b"req", StreamRecorder(Completions(), RequestOutput()), waiter)
    conn.data_received(
        _response([b'{"error": "overloaded"}'], chunked=False, status=503, extra=b"Connection: close\r\n")
    )
    assert waiter.result == 'HTTP 503: {"error": "overloaded"}' and conn.closed
    conn = _Connection()
    conn.connection_made(_Transport())
    waiter = _Waiter()
    conn.start(b"req", StreamRecorder(Completions(), RequestOutput()), waiter)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nda")
    conn.connection_lost(None)
    assert waiter.result.startswith("connection closed by the server")


def test_importing_magpie_and_the_serving_modules_is_light():
    code = (
        "import sys, magpie, magpie.cli, magpie.serving.load, magpie.serving.http, magpie.serving.stub_server;"
        "heavy = [m for m in ('torch', 'numpy', 'aiohttp') if m in sys.modules]; print(heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
    code = "import sys, magpie, magpie.cli; print([m for m in sys.modules if m.startswith('magpie.serving')])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
