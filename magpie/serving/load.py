"""Load generation: precomputed arrivals, the concurrency limit, warm-ups and the measured run.

Arrival offsets are drawn before the run: gaps from a gamma distribution of shape `burstiness`
and mean 1/rate (1 is a Poisson process, < 1 burstier, `inf` evenly spaced), summed and rescaled
so that the last request is sent at N/rate; an infinite rate sends everything at once. The
dispatcher sleeps to each offset and starts the request as a task; `max_concurrency` is a
semaphore the request holds while it is in flight (the time spent waiting for it is the
request's `client_queue_time`, not part of its latencies). Warm-ups send the first prompt before
the clock starts. The run's duration runs from the first dispatch to the last completion. The
garbage collector's existing heap is frozen for the run so its pauses stay short.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from magpie.serving import metrics as _metrics
from magpie.serving.datasets import SampleRequest, custom_dataset, load_tokenizer, random_dataset, sharegpt_dataset
from magpie.serving.endpoints import endpoint as _endpoint
from magpie.serving.http import Client
from magpie.serving.models import LoadConfig, ServingMetrics
from magpie.serving.stream import Clock, RequestOutput


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the start at which each of n requests is sent."""
    if n <= 0:
        return []
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request rate must be positive, got {rate}")
    import numpy as np

    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    offsets = np.cumsum(gaps)
    if offsets[-1] > 0:
        offsets *= (n / rate) / offsets[-1]
    return offsets.tolist()


def load_samples(config: LoadConfig, tokenizer=None) -> list[SampleRequest]:
    """The dataset's requests, lengths in tokens of `tokenizer` (default: `config.tokenizer_id`'s), else words."""
    if tokenizer is None and config.tokenizer_id is not None:
        tokenizer = load_tokenizer(config.tokenizer_id)
    d = config.dataset
    if d.name == "random":
        return random_dataset(
            config.num_prompts,
            d.input_len,
            d.output_len or 128,
            range_ratio=d.range_ratio,
            prefix_len=d.prefix_len,
            seed=config.seed,
            tokenizer=tokenizer,
        )
    if d.name == "sharegpt":
        return sharegpt_dataset(
            d.path, config.num_prompts, output_len=d.output_len, seed=config.seed, tokenizer=tokenizer
        )
    return custom_dataset(d.path, config.num_prompts, output_len=d.output_len, seed=config.seed, tokenizer=tokenizer)


def count_output_tokens(outputs: Sequence[RequestOutput], tokenizer) -> None:
    """A request whose server sent no `usage.completion_tokens` gets its output text's token count, as vLLM's
    bench serve counts it (chunks may carry several tokens)."""
    for o in outputs:
        if o.success and o.usage_tokens is None and o.generated_text:
            o.output_tokens = len(tokenizer.encode(o.generated_text, add_special_tokens=False))


class RunRecord:
    """What one run produced: the per-request records in dispatch order and the run's duration."""

    def __init__(self, outputs: list[RequestOutput], duration: float, warmups: list[RequestOutput]) -> None:
        self.outputs, self.duration, self.warmups = outputs, duration, warmups


async def run(
    config: LoadConfig,
    samples: Sequence[SampleRequest],
    *,
    clock: Clock = time.perf_counter,
    sleep: Callable[[float], Any] = asyncio.sleep,
    client: Client | None = None,
    before_measured: Callable[[], Any] | None = None,
) -> RunRecord:
    """Sends `samples` as `config` says and returns their records; raises if the ready check fails.
    `before_measured` (blocking; run in a thread) is called after the warm-ups, before the measured
    requests: a profiler window then holds those alone, as vLLM's bench serve starts its profiler."""
    if not samples:
        raise ValueError("no requests to send")
    ignore_eos = config.ignore_eos if config.ignore_eos is not None else config.dataset.name == "random"
    own = client is None
    if own:
        client = Client(
            config.base_url,
            _endpoint(config.endpoint),
            model=config.model,
            headers=config.headers,
            timeout_s=config.timeout_s,
            clock=clock,
            ignore_eos=ignore_eos,
            extra_body=config.extra_body or None,
            force_len=config.force_len,
        )
    limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else nullcontext()
    first = samples[0]
    try:
        if config.ready_check:
            probe = await client.send(first.prompt, first.prompt_len, first.expected_output_len)
            if not probe.success:
                raise RuntimeError(f"the ready-check request to {config.base_url} failed: {probe.error}")
        warm_data = client.encode(first.prompt, first.expected_output_len)

        async def warm() -> RequestOutput:
            async with limit:
                return await client.send(first.prompt, first.prompt_len, first.expected_output_len, data=warm_data)

        warmups = list(await asyncio.gather(*(warm() for _ in range(config.num_warmups))))
        if before_measured is not None:
            await asyncio.to_thread(before_measured)
        offsets = arrival_offsets(len(samples), config.request_rate, config.burstiness, config.seed)
        bodies = [client.encode(s.prompt, s.expected_output_len) for s in samples]

        async def limited(s: SampleRequest, data: bytes, arrival: float) -> RequestOutput:
            async with limit:
                out = await client.send(s.prompt, s.prompt_len, s.expected_output_len, data=data)
            out.client_queue_time = out.start_time - arrival
            return out

        gc.collect()
        gc.freeze()
        try:
            loop = asyncio.get_running_loop()
            tasks = []
            start = clock()
            for s, data, offset in zip(samples, bodies, offsets):
                if offset > 0:
                    wait = start + offset - clock()
                    if wait > 0:
                        await sleep(wait)
                tasks.append(loop.create_task(limited(s, data, clock())))
            outputs = list(await asyncio.gather(*tasks))
            duration = clock() - start
        finally:
            gc.unfreeze()
        if config.tokenizer_id is not None:
            count_output_tokens(outputs, load_tokenizer(config.tokenizer_id))
        return RunRecord(outputs, duration, warmups)
    finally:
        if own:
            client.close()


def vllm_result(
    config: LoadConfig,
    record: RunRecord,
    metrics: ServingMetrics,
    flat: dict[str, float],
    *,
    detailed: bool = False,
    date: str | None = None,
) -> dict[str, Any]:
    """The run under the keys of vLLM's `bench serve --save-result` JSON, in its order: what it writes by default
    (`latencies`, `queue_times` and `rtfx` included; `rtfx` is 0.0 without audio input) and with `--save-detailed`
    the per-request lists. Statistics of every metric at p50/p90/p95/p99 (vLLM's default is p99 of ttft, tpot and
    itl) and at the percentiles `flat` holds besides (`metrics.compute(percentiles=...)`); with a concurrency limit also vLLM's `client_queue_time` ones, and with a finite rate too the
    `e2el_including_client_queue` ones. Strict JSON: an infinite rate is `"inf"`, as vLLM writes it."""
    outs = record.outputs
    backend = "openai-chat" if config.endpoint == "chat" else "openai"
    thr = metrics.throughput
    result: dict[str, Any] = {
        "date": date or datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": config.label or backend,
        "model_id": config.model,
        "tokenizer_id": config.tokenizer_id,
        "num_prompts": config.num_prompts,
        "request_rate": config.request_rate if not math.isinf(config.request_rate) else "inf",
        "burstiness": config.burstiness,
        "max_concurrency": config.max_concurrency,
        "duration": record.duration,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "empty": metrics.empty,
        "total_input_tokens": metrics.total_input_tokens,
        "total_output_tokens": metrics.total_output_tokens,
        "request_throughput": thr.request_throughput,
        "request_goodput": thr.request_goodput,
        "output_throughput": thr.output_throughput,
        "total_token_throughput": thr.total_token_throughput,
    }
    if detailed:
        result.update(
            {
                "input_lens": [o.prompt_len for o in outs],
                "output_lens": [o.output_tokens if o.success else 0 for o in outs],
                "ttfts": [o.ttft for o in outs],
                "itls": [o.itl for o in outs],
            }
        )
    result["latencies"] = [o.latency for o in outs]
    if detailed:
        result["start_times"] = [o.start_time for o in outs]
    result["queue_times"] = [o.client_queue_time for o in outs]
    if detailed:
        result.update({"generated_texts": [o.generated_text for o in outs], "errors": [o.error for o in outs]})
    result.update(
        {
            "max_output_tokens_per_s": thr.max_output_tokens_per_s,
            "max_concurrent_requests": metrics.max_concurrent_requests,
            "rtfx": 0.0,
        }
    )
    for name in ("ttft", "tpot", "itl", "e2el"):
        for key, value in flat.items():  # mean, median, std, then the percentiles in rising order
            if key.endswith(f"_{name}_ms"):
                result[key] = value
    if config.max_concurrency is not None:
        ok = [o for o in outs if o.success]
        queued = {"client_queue_time": [o.client_queue_time for o in ok]}
        if not math.isinf(config.request_rate):
            queued["e2el_including_client_queue"] = [o.latency + o.client_queue_time for o in ok]
        for name, values in queued.items():
            for stat, value in _metrics.stats_ms(values).items():
                result[f"{stat}_{name}_ms"] = value
    return result


def benchmark(
    config: LoadConfig, samples: Sequence[SampleRequest] | None = None, *, detailed: bool = False
) -> tuple[ServingMetrics, dict[str, Any], RunRecord]:
    """Loads the dataset, runs, computes: (Magpie's metrics, vLLM's result JSON, the records)."""
    samples = list(samples) if samples is not None else load_samples(config)
    record = asyncio.run(run(config, samples))
    metrics, flat = _metrics.compute(record.outputs, record.duration, goodput=config.goodput or None)
    return metrics, vllm_result(config, record, metrics, flat, detailed=detailed), record
