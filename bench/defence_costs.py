"""What the defences of issue 38 cost, side by side with the code before them: two versions of
magpie (source trees run through PYTHONPATH: a checkout, or `git archive COMMIT | tar -x -C DIR`)
measured in alternating rounds on one machine, `python -c pass` in each round to read its load by.

Per round and version:
- worker start: a process that imported torch (as the zygote has) forks, and the child enters a
  worker's sandbox (a scratch folder to write, `--memory-mb`) and writes one byte: fork to that
  byte, the median of `--starts`, in wall time and in the CPU time of the sandbox's processes
  (its waiter, init and the code's process: steadier on a busy machine);
- compare of 8: `magpie build -j 2` of a fresh project of one kernel (relu(x) * 2 on the CPU), a
  baseline and 8 candidates, every one judged and timed (short timing: warm-up 5 ms, budget 60 ms,
  3 rounds), the workspace removed before each build;
- no-op: `magpie build` of that project again, everything up to date (median of `--noops`).
Wall time (the CPU time of a build lies mostly in its zygote, which the CLI does not reap; for the
no-op, the CLI's own). Each build runs with a signing key of its own (`XDG_CONFIG_HOME` in a
temporary folder) and `MAGPIE_KEEP_WARM_S` unset; a build in which any implementation was not
judged (an evaluator error, a failure) stops the run.

Usage: python bench/defence_costs.py OLD_TREE NEW_TREE [--rounds 3] [--starts 10] [--noops 5] [--starts-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = {
    "c1": "torch.relu(x) * 2.0",
    "c2": "torch.clamp(x, min=0) * 2.0",
    "c3": "torch.relu(x * 2.0)",
    "c4": "torch.where(x > 0, x * 2.0, torch.zeros_like(x))",
    "c5": "torch.relu(x).mul(2.0)",
    "c6": "torch.maximum(x, torch.zeros_like(x)) * 2.0",
    "c7": "(x + x).clamp(min=0)",
    "c8": "torch.nn.functional.relu(x) * 2.0",
}
SPEC = """import torch


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype),)


def reference(x):
    return torch.relu(x) * 2.0
"""
MANIFEST_HEAD = """[project]
name = "defence-costs"
device = "cpu"

[defaults.timing]
warmup_ms = 5
budget_ms = 60
rounds = 3

[[kernel]]
id = "relu2"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "base"
source = "base.py"
"""

# Run in a fresh interpreter of the tree measured: fork a process that imported torch into a
# worker's sandbox, `repeat` times; print the times in seconds as JSON.
STARTS = """
import json, os, sys, tempfile, time
import torch
from magpie import sandbox

repeat, memory_mb = int(sys.argv[1]), int(sys.argv[2])
scratch = tempfile.mkdtemp()
policy = sandbox.Policy(write=[scratch], memory_mb=memory_mb)
times = []
for _ in range(repeat):
    read, write = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        sandbox.enter_or_exit(policy)
        os.write(write, b"x")
        os._exit(0)
    os.close(write)
    if os.read(read, 1) != b"x":
        raise SystemExit("the sandboxed child wrote nothing: " + str(os.waitpid(pid, 0)))
    wall = time.perf_counter() - started
    os.close(read)
    # the waiter reaps its init, which reaps the code's process: the tree's CPU time
    _, _, usage = os.wait4(pid, 0)
    times.append((wall, usage.ru_utime + usage.ru_stime))
os.rmdir(scratch)
print(json.dumps(times))
"""


def project(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "spec.py").write_text(SPEC)
    (root / "base.py").write_text("import torch\n\n\ndef kernel(x):\n    return torch.relu(x) * 2.0\n")
    tables = [MANIFEST_HEAD]
    for name, body in CANDIDATES.items():
        (root / f"{name}.py").write_text(f"import torch\n\n\ndef kernel(x):\n    return {body}\n")
        tables.append(f'[[kernel.candidates]]\nid = "{name}"\nsource = "{name}.py"\n')
    tables.append('[[kernel.testcases]]\nspec = "spec.py"\nshapes = [[33, 65]]\n')
    (root / "magpie.toml").write_text("\n".join(tables))


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the process and its children) of one command."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status:
        raise SystemExit(f"{' '.join(cmd)} in {cwd} failed ({status}): {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def judged(root: Path) -> None:
    """Stop where any implementation's stored result is not a verdict on its code."""
    for result in (root / "workspaces" / "store").rglob("result.json"):
        verdict = json.loads(result.read_text()).get("verdict", "")
        if "error" in verdict or "FAILED" in verdict or "failed" in verdict:
            raise SystemExit(f"{root}: {result} reads {verdict!r}")


def environment(tree: Path, config: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MAGPIE_KEEP_WARM_S", "MAGPIE_SIGNING_KEY")}
    return {**env, "PYTHONPATH": str(tree), "XDG_CONFIG_HOME": str(config)}


def ms(samples: list[float]) -> dict:
    values = [s * 1000 for s in samples]
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--noops", type=int, default=5)
    parser.add_argument("--memory-mb", type=int, default=3072)
    parser.add_argument("--starts-only", action="store_true", help="time worker starts alone, no builds")
    args = parser.parse_args()
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="defence-costs-"))
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    found: dict[str, dict[str, list]] = {
        name: {"pass_wall": [], "start": [], "start_cpu": [], "compare_wall": [], "noop_wall": [], "noop_cpu": []}
        for name in trees
    }
    try:
        for round_number in range(args.rounds):
            for name in trees if round_number % 2 == 0 else reversed(list(trees)):
                tree, into = trees[name], found[name]
                env = environment(tree, work / f"config-{name}")
                into["pass_wall"].append(timed([python, "-c", "pass"], work, env)[0])
                starts = subprocess.run(
                    [python, "-c", STARTS, str(args.starts), str(args.memory_mb)],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                walls, cpus = zip(*json.loads(starts.stdout), strict=True)
                into["start"].append(statistics.median(walls))
                into["start_cpu"].append(statistics.median(cpus))
                if args.starts_only:
                    continue
                root = work / f"{name}-{round_number}"
                project(root)
                into["compare_wall"].append(timed([python, "-m", "magpie", "build", "-j", "2"], root, env)[0])
                judged(root)
                noops = [timed([python, "-m", "magpie", "build"], root, env) for _ in range(args.noops)]
                into["noop_wall"].append(statistics.median(w for w, _ in noops))
                into["noop_cpu"].append(statistics.median(c for _, c in noops))
                print(f"round {round_number} {name}: " + json.dumps({k: round(v[-1], 4) for k, v in into.items()}))
                sys.stdout.flush()
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "load_average": os.getloadavg(),
        "trees": {k: str(v) for k, v in trees.items()},
        **{name: {k: ms(v) for k, v in values.items() if v} for name, values in found.items()},
        # new over old, round by round (the two ran one after the other): the median of those ratios
        "new_over_old": {
            k: round(statistics.median(n / o for n, o in zip(found["new"][k], found["old"][k], strict=True)), 2)
            for k in found["old"]
            if found["old"][k]
        },
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
