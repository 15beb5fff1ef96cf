"""What the sandbox costs a process: from fork to the first line of code under test, with and
without the sandbox, in a process that imported torch (as the zygote has): plain, trusted
(below a keeper, `--trust-code`) and sandboxed. On a GPU also the first CUDA call inside it.
Prints JSON; figures go to docs/performance.md.

Usage: python bench/sandbox_cost.py [--repeat N] [--cuda] [--memory-mb MB]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402  (as in the zygote: imported before forking)

from magpie import sandbox  # noqa: E402


def once(policy: sandbox.Policy | str | None, cuda: bool) -> float:
    read, write = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if policy != "plain":
            sandbox.enter_or_exit(policy)  # None: trusted code, below a keeper
        if cuda:
            torch.cuda.synchronize()
        os.write(write, b"x")
        os._exit(0)
    os.close(write)
    os.read(read, 1)
    elapsed = time.perf_counter() - started
    os.close(read)
    os.waitpid(pid, 0)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cuda", action="store_true")
    # a worker's memory limit: as root a memory cgroup (with the pids one: one group on cgroup v2)
    parser.add_argument("--memory-mb", type=int, default=0)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp()
    policy = sandbox.Policy(write=[scratch], gpu=args.cuda, memory_mb=args.memory_mb)
    result = {
        "machine": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "cuda": args.cuda,
        "unavailable": sandbox.unavailable_reason(),
        "isolation": sandbox.describe(policy),
    }
    for name, chosen in (("plain", "plain"), ("trusted", None), ("sandboxed", policy)):
        times = [once(chosen, args.cuda) for _ in range(args.repeat)]
        result[f"{name}_ms"] = {
            "median": round(statistics.median(times) * 1000, 2),
            "min": round(min(times) * 1000, 2),
            "max": round(max(times) * 1000, 2),
        }
    result["cost_ms"] = round(result["sandboxed_ms"]["median"] - result["plain_ms"]["median"], 2)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
