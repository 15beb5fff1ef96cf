"""Magpie's serving figures beside a peer client's (GuideLLM) on the same server, in interleaved rounds.

The server is magpie's stub (`magpie.serving.stub_server`) in its own process, paced so the truth is known: the first
token after `--first-delay` seconds, each next one `--gap` seconds later (asyncio sleeps: a busy machine stretches
them, for both clients alike). Each round runs `magpie benchmark external --base-url ...` (the CLI, as a user runs it)
and `guidellm run` (its `openai_http` backend, `concurrent` profile, synthetic text) back to back, the order
alternating, with the same concurrency, request count and lengths. GuideLLM's names mapped onto vLLM's (those magpie
reports): its time to first token is TTFT; its `inter_token_latency` ((last token - first token) / (tokens - 1) per
request) is vLLM's TPOT; its `request_latency` is E2EL. Per metric: each client's median over the rounds, the
ratio magpie / GuideLLM per round (median and range) and whether the two clients' ranges over the rounds overlap
("within noise", the rule of `magpie benchmark --compare`).

GuideLLM is no dependency of magpie; give its executable (a virtual environment of its own keeps its pins away
from magpie's):

    python -m venv /tmp/guidellm && /tmp/guidellm/bin/pip install guidellm
    python bench/serving_peer.py --guidellm /tmp/guidellm/bin/guidellm [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACED_SERVER = """
import asyncio, sys
from magpie.serving.stub_server import Reply, StubServer
first, gap = float(sys.argv[1]), float(sys.argv[2])
async def main():
    srv = await StubServer("127.0.0.1", 0, script=lambda path, body: Reply(first_delay=first, delays=[gap] * 4096)).start()
    print("listening", srv.base_url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

# metric: (magpie's report path, GuideLLM's metric, its scale to ms)
METRICS = {
    "ttft_mean_ms": (("latency", "ttft", "mean_ms"), ("time_to_first_token_ms", "mean"), 1.0),
    "ttft_median_ms": (("latency", "ttft", "median_ms"), ("time_to_first_token_ms", "median"), 1.0),
    "ttft_p95_ms": (("latency", "ttft", "p95_ms"), ("time_to_first_token_ms", "p95"), 1.0),
    "tpot_mean_ms": (("latency", "tpot", "mean_ms"), ("inter_token_latency_ms", "mean"), 1.0),
    "tpot_median_ms": (("latency", "tpot", "median_ms"), ("inter_token_latency_ms", "median"), 1.0),
    "e2el_mean_ms": (("latency", "e2el", "mean_ms"), ("request_latency", "mean"), 1000.0),
    "e2el_median_ms": (("latency", "e2el", "median_ms"), ("request_latency", "median"), 1000.0),
    "request_throughput": (("throughput", "request_throughput"), ("requests_per_second", "mean"), 1.0),
}


def start_server(first_delay: float, gap: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PACED_SERVER, str(first_delay), str(gap)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"stub server did not start: {line!r}")
    return proc, line.split()[1]


def run_magpie(base_url: str, args, work: Path) -> dict:
    out = work / "magpie"
    command = [sys.executable, "-m", "magpie", "benchmark", "external", "--base-url", base_url, "-m", "stub"]
    command += ["--concurrency", str(args.concurrency), "--num-prompts", str(args.requests)]
    command += ["--input-len", str(args.input_len), "--output-len", str(args.output_len), "-o", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    report = json.loads((out / "benchmark_report.json").read_text())
    figures = {}
    for name, (path, _, _) in METRICS.items():
        value = report
        for part in path:
            value = value[part]
        figures[name] = value
    figures["completed"] = report["throughput"]["completed_requests"]
    return figures


def run_guidellm(base_url: str, args, work: Path) -> dict:
    from magpie.serving.tiny_model import build

    tokenizer = work / "tokenizer"
    if not tokenizer.exists():  # the synthetic data's token counts need one; the stub counts words
        build(tokenizer)
    out = work / "guidellm.json"
    command = [
        args.guidellm,
        "run",
        "--backend",
        f"kind=openai_http,target={base_url},model=stub,validate_backend=false",
    ]
    command += ["--profile", f"kind=concurrent,streams={args.concurrency}"]
    command += ["--constraint", f"kind=max_requests,count={args.requests}"]
    command += ["--data", f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}"]
    command += ["--tokenizer", f"kind=huggingface_auto,model={tokenizer}"]
    command += ["--output", f"kind=json,path={out}", "--disable-console"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    figures = {}
    for name, (_, (metric, stat), scale) in METRICS.items():
        block = metrics[metric]["successful"]
        figures[name] = (block["percentiles"]["p95"] if stat == "p95" else block[stat]) * scale
    figures["completed"] = metrics["request_totals"]["successful"]
    return figures


def guidellm_version(executable: str) -> str:
    return subprocess.run([executable, "--version"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guidellm", default=shutil.which("guidellm"), help="GuideLLM's executable")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--first-delay", type=float, default=0.05, help="the stub's seconds to the first token")
    parser.add_argument("--gap", type=float, default=0.01, help="the stub's seconds between tokens")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.guidellm:
        raise SystemExit("no guidellm on PATH: give --guidellm /path/to/guidellm (see this file's text)")
    load_before = os.getloadavg()
    proc, base_url = start_server(args.first_delay, args.gap)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="magpie-peer-") as tmp:
            work = Path(tmp)
            for round_ in range(args.rounds):
                order = ["magpie", "guidellm"] if round_ % 2 == 0 else ["guidellm", "magpie"]
                for client in order:
                    t0 = time.monotonic()
                    figures = (run_magpie if client == "magpie" else run_guidellm)(base_url, args, work)
                    rows.append(
                        {"round": round_, "client": client, "wall_s": round(time.monotonic() - t0, 1), **figures}
                    )
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    summary = {}
    for name in METRICS:
        mine = {r["round"]: r[name] for r in rows if r["client"] == "magpie"}
        peer = {r["round"]: r[name] for r in rows if r["client"] == "guidellm"}
        ratio = [mine[k] / peer[k] for k in mine if peer.get(k)]
        overlap = min(mine.values()) <= max(peer.values()) and min(peer.values()) <= max(mine.values())
        summary[name] = {
            "magpie": statistics.median(mine.values()),
            "guidellm": statistics.median(peer.values()),
            "ratio_median": statistics.median(ratio),
            "ratio_min": min(ratio),
            "ratio_max": max(ratio),
            "within_noise": overlap,
        }
        s = summary[name]
        print(
            f"{name:20} magpie {s['magpie']:9.3f}  guidellm {s['guidellm']:9.3f}  ratio {s['ratio_median']:.3f} "
            f"({s['ratio_min']:.3f}-{s['ratio_max']:.3f})  {'within noise' if overlap else 'apart'}",
            flush=True,
        )
    facts = {
        "date": date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "guidellm": guidellm_version(args.guidellm),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "guidellm")},
        "rows": rows,
        "summary": summary,
    }
    if args.json:
        args.json.write_text(json.dumps(facts, indent=1))


if __name__ == "__main__":
    main()
