"""Why a worker's first call is slow (run on the H200): the first launches of a few kernels,
timed in a fresh process and in children forked from a parent that imported torch (and Triton)."""

import json
import os
import sys
import time

CHILD = r"""
import time, torch
def t(label, fn):
    s = time.perf_counter(); r = fn(); torch.cuda.synchronize(); out[label] = round(time.perf_counter() - s, 4); return r
out = {}
x = t("to_device", lambda: torch.randn(16777216).to("cuda"))
y = torch.randn(16777216).to("cuda")
t("first x*2+y", lambda: x * 2 + y)
t("second x*2+y", lambda: x * 2 + y)
t("first amax", lambda: x.amax())
t("first add alpha", lambda: torch.add(y, x, alpha=2.0))
t("sum", lambda: x.sum())
"""


def run_child(env_note: str) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        scope: dict = {}
        try:
            exec(compile(CHILD, "child", "exec"), scope)
            os.write(write, json.dumps(scope["out"]).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return {"how": env_note, **json.loads(data or b"{}")}


def main() -> int:
    facts = {k: os.environ.get(k) for k in ("CUDA_CACHE_DISABLE", "CUDA_CACHE_PATH", "CUDA_MODULE_LOADING", "HOME")}
    facts["nv_cache"] = os.path.isdir(os.path.expanduser("~/.nv/ComputeCache"))
    results = [facts]
    import subprocess
    proc = subprocess.run([sys.executable, "-c", CHILD + "\nimport json; print(json.dumps(out))"],
                          capture_output=True, text=True)
    results.append({"how": "fresh process", **json.loads(proc.stdout.strip().splitlines()[-1])})
    import torch  # noqa: F401
    results.append(run_child("forked after import torch"))
    results.append(run_child("forked after import torch, again"))
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    results.append(run_child("forked after import torch and triton"))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
