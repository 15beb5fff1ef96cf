"""Are honest implementations ever accused on a busy machine, and are the CPU cheats still caught there?

One project of several kernels, built whole (`magpie build -j 2`) `--repeats` times at each load
of `--loads`: the machine as it is, then with N CPU hogs (`while True: pass` processes) beside
the build. The machine's load average is recorded around each build (other work on a shared
machine counts: a "quiet" build is only as quiet as the machine was).

Honest implementations (every baseline and honest candidate is judged: a baseline's own timing
job too), from ~5 µs to ~50 ms a call on the 2-core CPU machine:
- relu(x) * 2 (the adversarial fixtures' spec) on 8x8, 33x65, 1024x1024 and 4096x2048 sets:
  eager, ten operations, TorchScript, a lookup table, clamp, where, maximum, and a Triton kernel
  run by Triton's interpreter;
- the example's softmax (64x1024): torch.softmax, the naive one, the Triton row-wise one;
- calls that spin 0.25, 0.5, 2 and 20 ms of CPU time.
Cheats of the adversarial suite (tests/fixtures/adversarial, tests/test_implausible_timing.py,
tests/test_uneven_calls.py), each beside a baseline of its honest cost, so that anything credited
over CHEAT_CREDIT is what the cheat gained: a batch loop replaced by one operation over the
batch (also with slow calls, sleeps and moved threads, and above the launch floor), timers that
claim calls not made, work handed to a passing process, a call counter, work done in one call of
four.

An honest failure: any timing state but SUCCESS (FAILED; INCONCLUSIVE, the machine too busy to
measure, is counted apart: not a failure, not a verdict) or any correctness state but SUCCESS.
A cheat is rejected where its timing FAILED or it is credited no more than CHEAT_CREDIT.

Usage: python bench/honest_under_load.py [--loads 0,2,4] [--repeats 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "adversarial"
CHEAT_CREDIT = 1.2

SPIN = (
    "import time\n\nimport torch\n\n\ndef spin(seconds):\n    end = time.thread_time() + seconds\n"
    "    while time.thread_time() < end:\n        pass\n"
)


def spinning(seconds: float) -> str:
    return SPIN + f"\n\ndef kernel(x):\n    spin({seconds})\n    return torch.relu(x) * 2.0\n"


def relu(expression: str, head: str = "") -> str:
    return f"import torch\n{head}\n\ndef kernel(x):\n    return {expression}\n"


TRITON_RELU = """import torch
import triton
import triton.language as tl


@triton.jit
def _relu2(out_ptr, in_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(in_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0) * 2.0, mask=mask)


def kernel(x):
    out = torch.empty_like(x)
    n = x.numel()
    block = min(16384, triton.next_power_of_2(n))
    _relu2[(triton.cdiv(n, block),)](out, x, n, BLOCK=block)
    return out
"""
HONEST_RELU = {
    "eager": relu("torch.relu(x) * 2.0"),
    "ten_ops": (FIXTURES / "many_ops.py").read_text(),
    "scripted": "import torch\n\n\n@torch.jit.script\ndef kernel(x):\n    return torch.relu(x) * 2.0\n",
    "table": relu("torch.relu(x) * _TABLE[:x.numel()].view_as(x)", "\n_TABLE = torch.full((4096,), 2.0)\n"),
    "clamp": relu("x.clamp(min=0) * 2.0"),
    "where": relu("torch.where(x > 0, x * 2.0, torch.zeros_like(x))"),
    "maximum": relu("torch.maximum(x, torch.zeros_like(x)) * 2.0"),
    "triton": TRITON_RELU,
}
# kernel id: (spec, shape, baseline, honest candidates, cheats); a name is a source above, a spin of
# that many seconds ("spin_0.002"), an adversarial fixture, or one of the cheats below
KERNELS = {
    "relu_8x8": (
        "relu",
        "[8, 8]",
        "eager",
        ["ten_ops", "scripted", "table", "clamp", "where", "maximum", "triton"],
        ["batches_its_calls", "batches_and_moves", "claims_calls_not_made"],
    ),
    "relu_33x65": (
        "relu",
        "[33, 65]",
        "eager",
        ["ten_ops", "scripted", "clamp", "where", "triton"],
        ["claims_handed_over_calls", "works_in_a_passing_process", "memoizes"],
    ),
    "relu_ten_ops": ("relu", "[8, 8]", "ten_ops", [], ["batches_many_ops"]),
    "relu_ten_ops_33x65": (
        "relu",
        "[33, 65]",
        "ten_ops",
        [],
        ["batches_many_ops", "batches_above_floor", "batches_and_sleeps"],
    ),
    "relu_1024": ("relu", "[1024, 1024]", "eager", ["ten_ops", "clamp", "triton"], []),
    "relu_4096x2048": ("relu", "[4096, 2048]", "eager", ["ten_ops", "where"], []),
    "slow_call": ("relu", "[33, 65]", "slow_cpu_call", ["spin_0.00025", "spin_0.02"], ["batches_slow_cpu_call"]),
    "spin": ("relu", "[8, 128]", "spin_0.002", ["spin_0.0005"], ["counts_calls"]),
    "spin_steady": ("relu", "[8, 128]", "spin_0.0005", [], ["bursty"]),
    "softmax": ("softmax", "[64, 1024]", "torch_softmax", ["torch_naive", "triton_rowwise"], []),
}
# tests/test_implausible_timing.py's and tests/test_uneven_calls.py's cheats
CHEATS = {
    "counts_calls": SPIN + "\n_calls = [0]\n\n\ndef kernel(x):\n    _calls[0] += 1\n    if _calls[0] > 70:\n"
    "        spin(0.002)\n    return torch.relu(x) * 2.0\n",
    "bursty": SPIN + "\n_calls = [0]\n\n\ndef kernel(x):\n    _calls[0] += 1\n    if _calls[0] % 4 == 0:\n"
    "        spin(0.002)\n    return torch.relu(x) * 2.0\n",
}


def source(name: str) -> tuple[str, str]:
    """(type, code) of an implementation's name."""
    if name.startswith("spin_"):
        return "pytorch", spinning(float(name.removeprefix("spin_")))
    if name in HONEST_RELU:
        return ("triton" if name == "triton" else "pytorch"), HONEST_RELU[name]
    if name in CHEATS:
        return "pytorch", CHEATS[name]
    if name in ("torch_softmax", "torch_naive", "triton_rowwise"):
        code = (REPO / "kernels" / "softmax" / f"{name}.py").read_text()
        return ("triton" if name.startswith("triton") else "pytorch"), code.replace("def softmax(", "def kernel(")
    return "pytorch", (FIXTURES / f"{name}.py").read_text()


def write_project(root: Path) -> dict[str, dict[str, str]]:
    """The project; per kernel, each implementation's role (baseline, honest, cheat)."""
    (root / "relu_spec.py").write_text((FIXTURES / "spec.py").read_text())
    (root / "softmax_spec.py").write_text((REPO / "kernels" / "softmax" / "spec.py").read_text())
    roles: dict[str, dict[str, str]] = {}
    tables = []
    for kernel, (spec, shape, baseline, honest, cheats) in KERNELS.items():
        roles[kernel] = {baseline: "baseline", **dict.fromkeys(honest, "honest"), **dict.fromkeys(cheats, "cheat")}
        folder = root / kernel
        folder.mkdir()
        entries = []
        for name in roles[kernel]:
            kind, code = source(name)
            (folder / f"{name}.py").write_text(code)
            entries.append((name, kind))
        (base, base_kind), *others = entries
        text = (
            f'[[kernel]]\nid = "{kernel}"\ntype = "pytorch"\nentry = "kernel"\n\n'
            f'[kernel.baseline]\nid = "{base}"\ntype = "{base_kind}"\nsource = "{kernel}/{base}.py"\n\n'
        )
        for name, kind in others:
            text += f'[[kernel.candidates]]\nid = "{name}"\ntype = "{kind}"\nsource = "{kernel}/{name}.py"\n\n'
        text += f'[[kernel.testcases]]\nspec = "{spec}_spec.py"\nshapes = [{shape}]\n'
        tables.append(text)
    (root / "magpie.toml").write_text(
        '[project]\nname = "under_load"\ndevice = "cpu"\n\n[defaults]\ntrials = 1\ntimeout_s = 300\n\n'
        # the example project's timing (magpie.toml)
        "[defaults.timing]\nwarmup_ms = 20\nbudget_ms = 250\nrounds = 5\ninput_sets = 4\nthreads = 1\n\n"
        + "\n".join(tables)
    )
    return roles


def build(root: Path, roles: dict[str, dict[str, str]]) -> dict:
    shutil.rmtree(root / "workspaces", ignore_errors=True)
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", "build", "-j", "2"], cwd=root, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - started
    out = {
        "build_s": round(wall, 1),
        "exit": proc.returncode,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "rows": {},
    }
    for kernel, names in roles.items():
        path = root / "workspaces" / "reports" / kernel / "compare_report.json"
        report = json.loads(path.read_text()) if path.exists() else {"results": []}
        for row in report["results"]:
            name = row["implementation"]
            speedup = row.get("speedup") or {}
            result = row.get("performance_result") or {}
            out["rows"][f"{kernel}/{name}"] = {
                "role": names.get(name),
                "correctness_state": row.get("correctness_state"),
                "performance_state": row.get("performance_state"),
                "kinds": sorted({f["kind"] for f in row.get("failures") or []}),
                "flags": sorted({f["kind"] for f in row.get("flags") or []}),
                "errors": [e[:300] for e in row.get("errors") or []],
                "median_us": result.get("median_us"),
                "harness_us": result.get("harness_us_per_call"),
                # the launch floor's reading: a call's median time, its copies in, over the copy's price
                # (under 1 + LAUNCH_FLOOR fails); the calls-alone bound's ratio (over ALONE_FAIL fails)
                "floor_ratio": floor_ratio(result),
                "alone_ratio": (result.get("alone_bound") or {}).get("ratio"),
                "cpu_wait_share": result.get("cpu_wait_share"),
                "speedup": speedup.get("value"),
                "verdict": speedup.get("verdict"),
            }
    return out


def floor_ratio(result: dict) -> float | None:
    harness = result.get("harness_us_per_call")
    if not harness or result.get("median_us") is None:
        return None
    return (result["median_us"] + result.get("harness_taken_off_us", harness)) / harness


def judged(row: dict) -> str:
    """honest rows: ok, failed or inconclusive; cheat rows: rejected or credited."""
    if row["role"] == "cheat":
        rejected = row["performance_state"] != "SUCCESS" or (row["speedup"] or 0) <= CHEAT_CREDIT
        return "rejected" if rejected else "credited"
    if row["performance_state"] == "INCONCLUSIVE":
        return "inconclusive"
    return "ok" if row["correctness_state"] == "SUCCESS" and row["performance_state"] == "SUCCESS" else "failed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,2,4", help="CPU hogs beside the build, per series")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the figures here too (after every build)")
    args = parser.parse_args()
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "builds": []}
    root = Path(tempfile.mkdtemp(prefix="magpie-under-load-"))
    try:
        roles = write_project(root)
        out["implementations"] = {
            "honest": sum(r != "cheat" for k in roles.values() for r in k.values()),
            "cheats": sum(r == "cheat" for k in roles.values() for r in k.values()),
        }
        for hogs in map(int, args.loads.split(",")):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
            try:
                for repeat in range(args.repeats):
                    record = {"hogs": hogs, "repeat": repeat, **build(root, roles)}
                    out["builds"].append(record)
                    counts: dict[str, int] = {}
                    for row in record["rows"].values():
                        row["judged"] = judged(row)
                        counts[row["judged"]] = counts.get(row["judged"], 0) + 1
                    record["counts"] = counts
                    bad = {
                        n: (r["performance_state"], r["kinds"], r["errors"][:1])
                        for n, r in record["rows"].items()
                        if r["judged"] in ("failed", "credited", "inconclusive")
                    }
                    print(
                        f"hogs {hogs} repeat {repeat}: load {record['load_before'][0]:.1f} -> "
                        f"{record['load_after'][0]:.1f}, {record['build_s']} s, exit {record['exit']}: {counts}",
                        flush=True,
                    )
                    for name, what in bad.items():
                        print(f"  {name}: {what}", flush=True)
                    if args.json:
                        Path(args.json).write_text(json.dumps(out, indent=1))
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
