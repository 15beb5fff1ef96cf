"""Where a Triton kernel's first call in a new process goes (run on a GPU).

Each worker is a new process with a Triton cache of its implementation's own (content-keyed:
docs/security.md), and its first call took 1.1-1.4 s on the H200 in the 8-candidate compare,
cache warm or not. This times, in fresh processes: CUDA's context, Triton's driver utilities
(a C module Triton compiles into its cache), the kernel's first launch, and a second launch;
first with an empty cache, then with the cache the first process left, then with an empty
cache again but the driver utilities already loaded before CUDA started (what a zygote could
do before it forks).
Usage: python bench/triton_first_call.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

CHILD = textwrap.dedent("""
    import json, sys, time
    laps = {}
    mark = time.perf_counter()
    def lap(name):
        global mark
        now = time.perf_counter()
        laps[name] = round(now - mark, 4)
        mark = now
    import torch, triton, triton.language as tl
    lap("import")
    if sys.argv[1] == "utils_first":
        triton.runtime.driver.active.utils  # Triton's C driver module, compiled or found in the cache
        lap("driver_utils")
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    lap("cuda_context")
    if sys.argv[1] != "utils_first":
        triton.runtime.driver.active.utils
        lap("driver_utils")

    @triton.jit
    def scale(x, o, n, B: tl.constexpr):
        off = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(o + off, tl.load(x + off, mask=off < n) * 2, mask=off < n)

    o = torch.empty_like(x)
    scale[(x.numel() // 1024,)](x, o, x.numel(), B=1024)
    torch.cuda.synchronize()
    lap("first_launch")
    scale[(x.numel() // 1024,)](x, o, x.numel(), B=1024)
    torch.cuda.synchronize()
    lap("second_launch")
    print(json.dumps(laps))
""")


def run(cache: str, order: str) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": cache}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, order], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": proc.stderr[-800:]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": round(time.perf_counter() - started, 4)}


def main() -> int:
    out = sys.argv[1]
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for trial in range(3):
            fresh = os.path.join(root, f"fresh{trial}")
            results[f"empty cache {trial}"] = run(fresh, "context_first")
            results[f"the same cache again {trial}"] = run(fresh, "context_first")
            results[f"empty cache, utils before CUDA {trial}"] = run(os.path.join(root, f"utils{trial}"),
                                                                      "utils_first")
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    for name, laps in results.items():
        print(f"{name:>36}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in laps.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
