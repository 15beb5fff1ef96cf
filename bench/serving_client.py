"""The load client's own cost: how fast it can send, and how little it adds to what it measures.

A stub server (`magpie.serving.stub_server`, whole answer in one write, from a cache) runs in its
own process; the client, in this one, sends random-dataset requests of 32 output tokens each:

1. sustained: every request at once (rate inf) under a max-concurrency limit, completed requests/s
   over the run (target ≥ 1,000 req/s on a 2-core machine);
2. at 100 req/s (Poisson), the measured TTFT of that instant server (target p99 < 2 ms);

both for Magpie's client (`magpie.serving`: protocol-level keep-alive connections, SSE parsed and
stamped where bytes arrive, typed msgspec chunk decoding) and, where aiohttp is installed, for a
client built the way vLLM's `bench serve` is (one shared aiohttp `ClientSession`, the body read
with `iter_any`, messages split on blank lines, `json.loads` per message), written here for the
comparison, with the same arrivals, semaphore and metrics.

    python bench/serving_client.py [--requests 20000] [--rate-requests 3000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from magpie.serving import metrics as serving_metrics  # noqa: E402
from magpie.serving.datasets import random_dataset  # noqa: E402
from magpie.serving.load import arrival_offsets, run  # noqa: E402
from magpie.serving.models import DatasetConfig, LoadConfig  # noqa: E402
from magpie.serving.stream import RequestOutput  # noqa: E402


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "magpie.serving.stub_server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"stub server did not start: {line!r}")
    return proc, line.split()[1]


# --- the shared-session design, for comparison (needs aiohttp) ---------------------------------------
async def shared_session_run(base_url: str, samples, rate: float, concurrency: int | None) -> tuple[list, float]:
    import aiohttp

    url = base_url + "/v1/completions"
    connector = aiohttp.TCPConnector(
        limit=concurrency or 0, limit_per_host=concurrency or 0, force_close=False, keepalive_timeout=60
    )
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600))
    sem = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(s) -> RequestOutput:
        body = {
            "model": "stub",
            "prompt": s.prompt,
            "max_tokens": s.expected_output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        out = RequestOutput(s.prompt_len, time.perf_counter())
        try:
            async with session.post(url, json=body) as resp:
                pending = ""
                async for data in resp.content.iter_any():
                    pending += data.decode()
                    while "\n\n" in pending:
                        msg, pending = pending.split("\n\n", 1)
                        msg = msg.strip()
                        if not msg.startswith("data:"):
                            continue
                        payload = msg[5:].strip()
                        if payload == "[DONE]":
                            continue
                        now = time.perf_counter()
                        chunk = json.loads(payload)
                        if chunk.get("choices") and chunk["choices"][0].get("text"):
                            out.token_times.append(now)
                        elif chunk.get("usage"):
                            out.usage_tokens = chunk["usage"].get("completion_tokens")
        except Exception as exc:  # noqa: BLE001 - a failed request is a record
            out.error = repr(exc)
        t = out.token_times
        if t and not out.error:
            out.success, out.ttft, out.latency = True, t[0] - out.start_time, t[-1] - out.start_time
            out.itl = [b - a for a, b in zip(t, t[1:])]
            out.output_tokens = out.usage_tokens or len(t)
        return out

    async def limited(s):
        if sem is None:
            return await one(s)
        async with sem:
            return await one(s)

    await one(samples[0])
    offsets = arrival_offsets(len(samples), rate, 1.0, 0)
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    tasks = []
    for s, off in zip(samples, offsets):
        if off > 0:
            wait = start + off - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(limited(s)))
    outs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    gc.unfreeze()
    await session.close()
    return outs, duration


def measure(design: str, base_url: str, n: int, rate: float, concurrency: int | None) -> dict:
    samples = random_dataset(n, 32, 32, seed=0)
    if design == "magpie":
        config = LoadConfig(
            base_url=base_url,
            model="stub",
            num_prompts=n,
            request_rate=rate,
            max_concurrency=concurrency,
            dataset=DatasetConfig(input_len=32, output_len=32),
        )
        record = asyncio.run(run(config, samples))
        outs, duration = record.outputs, record.duration
    else:
        outs, duration = asyncio.run(shared_session_run(base_url, samples, rate, concurrency))
    m, _ = serving_metrics.compute(outs, duration)
    tokens = {o.output_tokens for o in outs if o.success}
    return {
        "design": design,
        "requests": n,
        "rate": rate,
        "max_concurrency": concurrency,
        "completed": m.completed,
        "failed": m.failed,
        "output_tokens_per_request": sorted(tokens),
        "duration_s": round(duration, 3),
        "req_per_s": round(m.throughput.request_throughput, 1),
        "ttft_ms": {k: round(getattr(m.latency.ttft, k), 3) for k in ("median", "p90", "p99")},
        "ttft_max_ms": round(max((o.ttft for o in outs if o.success), default=0) * 1000, 3),
        "e2el_p99_ms": round(m.latency.e2el.p99, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per sustained run")
    parser.add_argument("--rate-requests", type=int, default=3000, help="requests of the 100 req/s run")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        import aiohttp  # noqa: F401

        designs = ["magpie", "shared-session"]
    except ImportError:
        designs = ["magpie"]
    proc, base_url = start_server()
    rows = []
    try:
        for design in designs:
            for c in args.concurrency:
                rows.append(measure(design, base_url, args.requests, float("inf"), c))
                print(json.dumps(rows[-1]), flush=True)
            rows.append(measure(design, base_url, args.rate_requests, 100.0, None))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    facts = {
        "date": date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
