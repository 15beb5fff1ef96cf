"""Does another process making its CUDA context disturb a measurement on the GPU? (run on a GPU)

A build's workers each make a CUDA context (0.24 s alone on the H200, nine at once 2.0-2.3 s
each: the driver makes them one after another). Whether a timing job may run while other
workers make theirs decides whether those contexts must wait for the device lock.

This process times two kernels with CUDA events, in batches of 20 calls, continuously: a
memory-bound `x * 2 + y` on 16 Mi fp32 and a small one on 64 Ki (launch-bound). Meanwhile
children, forked (as the zygote forks workers) from a process that imported torch and made
no context, each make a CUDA context and take 1 MiB, then wait: first none (quiet), then eight
one after another, then quiet again, then eight at once. Per phase and kernel: the median and
the 10th and 90th percentiles of a call's time, from the batches that ended inside the phase
(for the children's phases, while a context was being made).
Usage: python bench/context_beside_timing.py OUT.json [cpu]  (cpu: a dry run of the phases)
"""

from __future__ import annotations

import json
import os
import select
import statistics
import sys
import time

import torch

CHILDREN = 8
CALLS = 20


def spawner(commands: int, answers: int, device: str) -> None:
    """Forks a child per command byte; each child makes a context, answers its start and end
    times, and waits until the spawner has ended."""
    while True:
        command = os.read(commands, 1)
        if not command or command == b"q":
            os._exit(0)
        if os.fork() == 0:
            spawner_pid = os.getppid()
            began = time.time()
            torch.empty(1 << 18, device=device).fill_(1.0)
            if device == "cuda":
                torch.cuda.synchronize()
            os.write(answers, json.dumps([began, time.time()]).encode() + b"\n")
            while os.getppid() == spawner_pid:
                time.sleep(0.05)
            os._exit(0)


def main() -> int:
    out = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cuda"  # "cpu": a dry run of the phases only
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    if os.fork() == 0:  # before this process makes its context
        spawner(commands_read, answers_write, device)
    kernels = {}
    for name, n in (("membound_16Mi", 1 << 24), ("small_64Ki", 1 << 16)):
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        kernels[name] = lambda x=x, y=y: x * 2 + y
    samples: list[tuple[str, float, float]] = []  # kernel, end time, µs a call

    def time_for(seconds: float, poll=None) -> None:
        end = time.time() + seconds
        while time.time() < end:
            for name, fn in kernels.items():
                fn()
                if device != "cuda":
                    started = time.perf_counter()
                    for _ in range(CALLS):
                        fn()
                    samples.append((name, time.time(), (time.perf_counter() - started) * 1e6 / CALLS))
                    continue
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(CALLS):
                    fn()
                stop.record()
                stop.synchronize()
                samples.append((name, time.time(), start.elapsed_time(stop) * 1000 / CALLS))
            if poll is not None and poll():
                return

    buffer = b""

    def answers_ready() -> list:
        nonlocal buffer
        got = []
        while select.select([answers_read], [], [], 0)[0]:
            buffer += os.read(answers_read, 4096)
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                got.append(json.loads(line))
        return got

    phases = {}
    for fn in kernels.values():  # warm
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.time()
    time_for(2.0)
    phases["quiet"] = [[t, time.time()]]
    windows = []
    for _ in range(CHILDREN):  # one after another
        os.write(commands_write, b"c")
        done = []
        time_for(30.0, poll=lambda: bool(done.extend(answers_ready()) or done))  # noqa: B023 (called within the iteration)
        windows.extend(done)
    phases["one_after_another"] = windows
    t = time.time()
    time_for(1.0)
    phases["quiet_again"] = [[t, time.time()]]
    os.write(commands_write, b"c" * CHILDREN)  # all at once
    windows = []
    time_for(30.0, poll=lambda: bool(windows.extend(answers_ready())) or len(windows) >= CHILDREN)
    phases["at_once"] = windows
    os.write(commands_write, b"q")
    os.wait()

    result = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else device,
        "torch": torch.__version__,
        "calls_a_batch": CALLS,
        "context_s": {p: [round(b - a, 3) for a, b in w] for p, w in phases.items() if not p.startswith("quiet")},
        "phases": {},
    }
    for phase, spans in phases.items():
        for name in kernels:
            inside = [us for k, end, us in samples if k == name and any(a <= end <= b for a, b in spans)]
            if len(inside) < 3:
                continue
            deciles = statistics.quantiles(inside, n=10)
            result["phases"].setdefault(phase, {})[name] = {
                "batches": len(inside),
                "median_us": round(statistics.median(inside), 3),
                "p10_us": round(deciles[0], 3),
                "p90_us": round(deciles[-1], 3),
                "max_us": round(max(inside), 3),
            }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
