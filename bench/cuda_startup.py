"""Where a GPU worker's first call goes (run on the H200): CUDA context creation, library
handles, magpie's timer set-up, each timed in a fresh process; alone, forked from a process
that imported torch, and while another process holds a context on the device.
Usage: python bench/cuda_startup.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

STEPS = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
marks = {"import_torch": time.perf_counter() - t0}
def mark(name, fn):
    t = time.perf_counter(); fn(); torch.cuda.synchronize(); marks[name] = time.perf_counter() - t
mark("context", lambda: torch.zeros(1, device="cuda"))
x = torch.randn(4096, 4096, device="cuda")
mark("first_matmul", lambda: x @ x)
mark("second_matmul", lambda: x @ x)
from magpie.harness.timing import CudaTimer, nvml_snapshot
timer = None
def make_timer():
    global timer
    timer = CudaTimer("cuda")
mark("cuda_timer", make_timer)
mark("nvml", lambda: nvml_snapshot(0))
mark("probe", lambda: timer.probe(lambda: x + 1, [()]))
print(json.dumps(marks))
"""


def fresh() -> dict:
    out = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-800:]}


def forked() -> dict:
    """The steps in a child forked from this process, which imported torch but no CUDA."""
    import torch  # noqa: F401

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 1)
        try:
            exec(compile(STEPS, "steps", "exec"), {"__name__": "steps"})
        finally:
            sys.stdout.flush()
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data.decode().strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    results = {
        "persistence_mode": subprocess.run(
            ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    }
    results["fresh"] = [fresh() for _ in range(2)]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, time; torch.zeros(1, device='cuda'); print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    holder.stdout.readline()
    results["fresh_while_held"] = [fresh() for _ in range(2)]
    results["forked_while_held"] = forked()
    holder.kill()
    results["forked"] = forked()
    print(json.dumps(results, indent=1))
    with open(argv[0], "w") as handle:
        json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
