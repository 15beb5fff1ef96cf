"""Distributions, throughput and goodput of a run's request records, as vLLM's `bench serve` computes them.

Failed requests are counted and left out of every distribution and total; a successful request with no
output text (an empty completion, `stream.py`) counts as completed, as vLLM counts it, and is also
counted in `empty`. Per successful request:
output tokens from usage (else counted token chunks); TPOT = (E2EL − TTFT)/(n − 1) for n > 1, so
its distribution weighs requests equally; ITLs pooled over all requests. Statistics are numpy's:
mean, median, population std, linear-interpolated percentiles; an empty distribution reads 0.
Throughput divides by the run's duration (first dispatch to last completion). A request is good
when each SLO given holds (value ≤ SLO; TPOT counts as 0 for one-token outputs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from magpie.serving.models import PERCENTILES, Latency, LatencyStats, ServingMetrics, Throughput
from magpie.serving.stream import RequestOutput


def stats_ms(values: Sequence[float], percentiles: Iterable[float] = PERCENTILES) -> dict[str, float]:
    """mean, median, std and p<P> of seconds, in milliseconds (numpy, linear percentiles, ddof 0)."""
    import numpy as np

    arr = np.asarray(values if len(values) else [0.0], dtype=float) * 1000.0
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    for p in percentiles:
        out[f"p{_pword(p)}"] = float(np.percentile(arr, p))
    return out


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def tpot(out: RequestOutput) -> float:
    n = out.output_tokens
    return (out.latency - out.ttft) / (n - 1) if n > 1 else 0.0


def compute(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    *,
    goodput: dict[str, float] | None = None,
    percentiles: Iterable[float] = (),
) -> tuple[ServingMetrics, dict[str, float]]:
    """The metrics and vLLM's flat per-metric keys (`mean_ttft_ms`, `p99_itl_ms`, ...); `percentiles` adds flat
    keys beside p50/p90/p95/p99 (`p99.9_ttft_ms`), as vLLM's `--metric-percentiles` does."""
    import numpy as np

    ok = [o for o in outputs if o.success]
    dists = distributions(ok)
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    good = None
    if goodput:
        limits = {k: v / 1000.0 for k, v in goodput.items()}
        good = sum(
            1
            for o in ok
            if o.ttft <= limits.get("ttft", math.inf)
            and tpot(o) <= limits.get("tpot", math.inf)
            and o.latency <= limits.get("e2el", math.inf)
        )
    peak_tokens, peak_concurrency = 0.0, 0
    if ok:
        t0 = min(o.start_time for o in ok)
        t_end = max(o.start_time + o.latency for o in ok)
        buckets = np.zeros(int(np.ceil(t_end - t0)) + 1)
        times = np.fromiter((t for o in ok for t in _token_times(o)), dtype=float)
        idx = (times - t0).astype(int)
        idx = idx[(idx >= 0) & (idx < len(buckets))]
        np.add.at(buckets, idx, 1)
        peak_tokens = float(buckets.max())
        events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
        level = 0
        for _, delta in events:  # ends sort before starts at the same instant: half-open intervals
            level += delta
            peak_concurrency = max(peak_concurrency, level)
    dur = duration_s if duration_s > 0 else math.inf
    wanted = sorted(set(PERCENTILES) | set(percentiles))
    blocks = {name: stats_ms(values, wanted) for name, values in dists.items()}
    flat = {}
    for name, block in blocks.items():
        for key, value in block.items():
            flat[f"{key}_{name}_ms"] = value
    metrics = ServingMetrics(
        duration=duration_s,
        completed=len(ok),
        failed=len(outputs) - len(ok),
        empty=sum(1 for o in ok if not o.generated_text),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        max_concurrent_requests=peak_concurrency,
        latency=Latency(
            **{
                name: LatencyStats(**{k: v for k, v in block.items() if k in LatencyStats.model_fields})
                for name, block in blocks.items()
            }
        ),
        throughput=Throughput(
            request_throughput=len(ok) / dur,
            request_goodput=None if good is None else good / dur,
            output_throughput=total_out / dur,
            total_token_throughput=(total_in + total_out) / dur,
            max_output_tokens_per_s=peak_tokens,
        ),
    )
    return metrics, flat


def distributions(ok: Sequence[RequestOutput]) -> dict[str, list[float]]:
    """Seconds per metric over the successful requests: TTFT, TPOT (requests of more than one token), pooled
    ITL, E2EL."""
    return {
        "ttft": [o.ttft for o in ok],
        "tpot": [tpot(o) for o in ok if o.output_tokens > 1],
        "itl": [gap for o in ok for gap in o.itl],
        "e2el": [o.latency for o in ok],
    }


def _token_times(o: RequestOutput) -> list[float]:
    if o.token_times:
        return o.token_times
    t = o.start_time + o.ttft
    out = [t]
    for gap in o.itl:
        t += gap
        out.append(t)
    return out
