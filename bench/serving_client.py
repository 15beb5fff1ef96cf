"""The load client's own cost: how fast it can send, and how little it adds to what it measures.

A stub server (`magpie.serving.stub_server`, whole answer in one write, from a cache) runs in its
own process; the client, in this one, sends random-dataset requests of 32 output tokens each:

1. sustained: every request at once (rate inf) under a max-concurrency limit, completed requests/s
   over the run (target ≥ 1,000 req/s on a 2-core machine);
2. at 100 req/s (Poisson), the measured TTFT of that instant server (target p99 < 2 ms);

each for Magpie's client (`magpie.serving`: protocol-level keep-alive connections, SSE parsed and
stamped where bytes arrive, typed msgspec chunk decoding), for the floor (bare asyncio streams:
pre-built request bytes, a response read until its last chunk and stamped at its first bytes,
nothing parsed: what any Python client on this machine, at this moment, cannot beat) and, where
aiohttp is installed, for a client built the way vLLM's `bench serve` is (one shared aiohttp
`ClientSession`, the body read with `iter_any`, messages split on blank lines, `json.loads` per
message), written here for the comparison, with the same arrivals, semaphore and metrics.

The machine is shared, so absolute figures move with its load; what holds is the ratio to the
floor measured beside it. Each round runs every design on each load back to back (the order rotated
per round); a design's ratios (req/s over the floor's, TTFT over the floor's and the milliseconds it
adds) are per round, against that round's floor, and reported as the median and range over rounds.

    python bench/serving_client.py [--requests 5000] [--rate-requests 1000] [--rounds 3] [--json out.json]
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


# --- the floor: bare asyncio streams, nothing parsed ---------------------------------------------------
async def floor_run(base_url: str, samples, rate: float, concurrency: int | None) -> tuple[list, float]:
    """Each request's bytes built before the run; a keep-alive connection per request in flight (idle ones
    reused, last used first); a response read until its closing chunk, TTFT at its first bytes."""
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    host, port = url.hostname, url.port
    requests = []
    for s in samples:
        body = json.dumps(
            {"model": "stub", "prompt": s.prompt, "max_tokens": s.expected_output_len, "stream": True}
        ).encode()
        requests.append(
            b"POST /v1/completions HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body)
        )
    idle: list = []
    sem = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(request: bytes, s) -> RequestOutput:
        out = RequestOutput(s.prompt_len, time.perf_counter())
        try:
            reader, writer = idle.pop() if idle else await asyncio.open_connection(host, port)
            writer.write(request)
            first, tail = None, b""
            while not tail.endswith(b"0\r\n\r\n"):
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed mid-response")
                if first is None:
                    first = time.perf_counter()
                tail = (tail + data)[-16:]
            end = time.perf_counter()
            idle.append((reader, writer))
            out.success, out.ttft, out.latency = True, first - out.start_time, end - out.start_time
            out.output_tokens = s.expected_output_len
        except OSError as exc:
            out.error = repr(exc)
        return out

    async def limited(request, s):
        if sem is None:
            return await one(request, s)
        async with sem:
            return await one(request, s)

    await one(requests[0], samples[0])
    offsets = arrival_offsets(len(samples), rate, 1.0, 0)
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    tasks = []
    for request, s, off in zip(requests, samples, offsets):
        if off > 0:
            wait = start + off - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(limited(request, s)))
    outs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    gc.unfreeze()
    for _, writer in idle:
        writer.close()
    return outs, duration


def measure(design: str, base_url: str, n: int, rate: float, concurrency: int | None) -> dict:
    samples = random_dataset(n, 32, 32, seed=0)
    if design == "floor":
        outs, duration = asyncio.run(floor_run(base_url, samples, rate, concurrency))
    elif design == "magpie":
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


def load_name(rate: float, concurrency: int | None, n: int) -> str:
    if rate == float("inf"):
        return f"{n:,} at once, max concurrency {concurrency}"
    return f"{n:,} at {rate:g} req/s (Poisson)"


def ratios(rows: list[dict]) -> list[dict]:
    """Per load and design (floor aside): the medians over rounds, and per round the ratio to that round's floor
    (req/s, TTFT median and p99) and the TTFT milliseconds added to it; median and range over the rounds."""
    import statistics

    def spread(values: list[float]) -> dict:
        return {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
        }

    out = []
    for load in dict.fromkeys(r["load"] for r in rows):
        floors = {r["round"]: r for r in rows if r["load"] == load and r["design"] == "floor"}
        for design in dict.fromkeys(r["design"] for r in rows if r["load"] == load):
            mine = [r for r in rows if r["load"] == load and r["design"] == design]
            row = {
                "load": load,
                "design": design,
                "rounds": len(mine),
                "req_per_s": spread([r["req_per_s"] for r in mine]),
                "ttft_median_ms": spread([r["ttft_ms"]["median"] for r in mine]),
                "ttft_p99_ms": spread([r["ttft_ms"]["p99"] for r in mine]),
            }
            if design != "floor":
                pairs = [(r, floors[r["round"]]) for r in mine]
                row["req_per_s_over_floor"] = spread([r["req_per_s"] / f["req_per_s"] for r, f in pairs])
                for stat in ("median", "p99"):
                    row[f"ttft_{stat}_over_floor"] = spread([r["ttft_ms"][stat] / f["ttft_ms"][stat] for r, f in pairs])
                    row[f"ttft_{stat}_added_ms"] = spread([r["ttft_ms"][stat] - f["ttft_ms"][stat] for r, f in pairs])
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="requests per sustained run")
    parser.add_argument("--rate-requests", type=int, default=1000, help="requests of the 100 req/s run")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3, help="each design on each load, back to back, this often")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        import aiohttp  # noqa: F401

        designs = ["floor", "magpie", "shared-session"]
    except ImportError:
        designs = ["floor", "magpie"]
    loads = [(float("inf"), c, args.requests) for c in args.concurrency] + [(100.0, None, args.rate_requests)]
    load_before = os.getloadavg()
    proc, base_url = start_server()
    rows = []
    try:
        for round_ in range(args.rounds):
            order = designs[round_ % len(designs) :] + designs[: round_ % len(designs)]
            for rate, concurrency, n in loads:
                for design in order:
                    row = measure(design, base_url, n, rate, concurrency)
                    row.update(round=round_, load=load_name(rate, concurrency, n))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    summary = ratios(rows)
    for row in summary:
        if row["design"] == "floor":
            continue
        r, t50, t99 = row["req_per_s_over_floor"], row["ttft_median_added_ms"], row["ttft_p99_added_ms"]
        print(
            f"{row['design']:>14} | {row['load']:<36} | {row['req_per_s']['median']:>8,.0f} req/s = "
            f"{r['median']:.2f}x floor ({r['min']:.2f}-{r['max']:.2f}) | TTFT median {t50['median']:+.3f} ms "
            f"({row['ttft_median_over_floor']['median']:.2f}x), p99 {t99['median']:+.3f} ms "
            f"({row['ttft_p99_over_floor']['median']:.2f}x)",
            flush=True,
        )
    facts = {
        "date": date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rows": rows,
        "summary": summary,
    }
    if args.json:
        args.json.write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
