"""Where a Triton kernel's first call in a new worker goes (run on a GPU).

Each worker is a child forked from magpie's zygote (torch and Triton imported) with a Triton
cache of its implementation's own (content-keyed: docs/security.md), and its first call took
1.1-1.4 s on the H200 in the 8-candidate compare, cache warm or not. This forks children the
same way and times, in each: CUDA's context, Triton's driver utilities (a C module Triton
compiles into its cache), the kernel's compile (`warmup`), its first launch, a second launch;
with the child's cache empty or left by an earlier child; then with Triton's own key (a hash
of its compiler, libtriton.so included) computed in the parent before it forks, and with the
child's empty cache seeded with the driver utilities a separate process compiled (what a
zygote could do: loading them in the parent makes CUDA's state, which a fork cannot carry).
The files each child's cache holds afterwards say what was compiled where. Last, N children
forked at once each make a CUDA context: whether the driver serialises them.
Usage: python bench/triton_first_call.py OUT.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

from magpie.harness.compiler_caches import triton_key_function


@triton.jit
def scale(x, o, n, B: tl.constexpr):
    off = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(o + off, tl.load(x + off, mask=off < n) * 2, mask=off < n)


def contexts_at_once(count: int) -> dict:
    """`count` children forked together, each making a CUDA context: when each began and ended,
    from the first fork."""
    t0 = time.time()
    pipes = []
    for _ in range(count):
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            began = time.time() - t0
            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            os.write(write, json.dumps([round(began, 4), round(time.time() - t0, 4)]).encode())
            os._exit(0)
        os.close(write)
        pipes.append(read)
    spans = []
    for read in pipes:
        spans.append(json.loads(os.read(read, 256) or b"null"))
        os.close(read)
        os.wait()
    return {"spans_s": spans, "last_end_s": max(s[1] for s in spans if s)}


def first_call(cache: str) -> dict:
    """In a forked child: the laps of its first call, and the files its cache holds after."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.environ["TRITON_CACHE_DIR"] = cache
        laps, mark = {}, time.perf_counter()

        def lap(name):
            nonlocal mark
            now = time.perf_counter()
            laps[name] = round(now - mark, 4)
            mark = now

        try:
            x = torch.ones(1 << 20, device="cuda")
            torch.cuda.synchronize()
            lap("cuda_context")
            _ = triton.runtime.driver.active.utils  # the attribute's first read loads the driver's helpers
            lap("driver_utils")
            o = torch.empty_like(x)
            grid = (x.numel() // 1024,)
            scale.warmup(x, o, x.numel(), B=1024, grid=grid)
            lap("compile")
            scale[grid](x, o, x.numel(), B=1024)
            torch.cuda.synchronize()
            lap("first_launch")
            scale[grid](x, o, x.numel(), B=1024)
            torch.cuda.synchronize()
            lap("second_launch")
            laps["cache_files"] = sorted(
                os.path.relpath(os.path.join(d, f), cache) for d, _, files in os.walk(cache) for f in files
            )
        except Exception as err:  # noqa: BLE001 - reported, the bench goes on
            laps["error"] = repr(err)[-600:]
        os.write(write, json.dumps(laps).encode())
        os._exit(0)
    os.close(write)
    started = time.perf_counter()
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return {**json.loads(b"".join(chunks) or b"{}"), "child_s": round(time.perf_counter() - started, 4)}


def main() -> int:
    out = sys.argv[1]
    results: dict = {}
    with tempfile.TemporaryDirectory() as root:
        # the parent's own cache (it compiles nothing)
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "parent")
        for trial in range(2):
            fresh = os.path.join(root, f"fresh{trial}")
            results[f"empty cache {trial}"] = first_call(fresh)
            results[f"the same cache again {trial}"] = first_call(fresh)
        template = os.path.join(root, "template")
        started = time.perf_counter()
        made = subprocess.run(
            [sys.executable, "-c", "import triton; triton.runtime.driver.active.utils"],
            env={**os.environ, "TRITON_CACHE_DIR": template},
            capture_output=True,
            text=True,
        )
        results["driver utilities compiled by another process"] = {
            "s": round(time.perf_counter() - started, 4),
            "rc": made.returncode,
            "stderr": made.stderr[-300:],
        }
        key = triton_key_function()
        started = time.perf_counter()
        if key is not None:
            key()
        results["parent computes Triton's key"] = {
            "s": round(time.perf_counter() - started, 4),
            "where": getattr(key, "__module__", None),
        }
        for trial in range(2):
            fresh = os.path.join(root, f"keyed{trial}")
            results[f"empty cache, key in the parent {trial}"] = first_call(fresh)
            results[f"the same cache again, key in the parent {trial}"] = first_call(fresh)
            seeded = os.path.join(root, f"seeded{trial}")
            shutil.copytree(template, seeded)
            results[f"empty cache seeded with the utilities, key in the parent {trial}"] = first_call(seeded)
        for count in (1, 4, 8):
            results[f"{count} contexts at once"] = contexts_at_once(count)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    for name, laps in results.items():
        print(f"{name:>62}: " + ", ".join(f"{k} {v}" for k, v in laps.items() if k != "cache_files"))
        if laps.get("cache_files"):
            print(f"{'':>62}  cache: " + ", ".join(f.split("/")[-1] for f in laps["cache_files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
