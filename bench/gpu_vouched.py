"""Vouched GPU timing (`timing.vouched`) against the worker's own timer, on one small kernel
(graph mode) and one large (events mode): the medians each reports for an honest relu, and
what each makes of two cheats (a cache keyed by the input's address, a kernel wrong only
while a batch is timed). Usage: python bench/gpu_vouched.py OUT.json [small|large ...]"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests/fixtures/adversarial"
CANDIDATES = ("memoizes", "lazy_when_timed")
SHAPES = {"small": "[[33, 65]]", "large": "[[4096, 4096]]"}


def build(root: Path, shape: str, vouched: bool) -> dict:
    for name in ("spec", "good", *CANDIDATES):
        shutil.copy(FIXTURES / f"{name}.py", root / f"{name}.py")
    tables = "".join(f'[[kernel.candidates]]\nid = "{n}"\nsource = "{n}.py"\n\n' for n in CANDIDATES)
    (root / "magpie.toml").write_text(f"""[project]
name = "relu2"
device = "cuda"

[defaults]
timeout_s = 60

[defaults.timing]
warmup_ms = 5
budget_ms = 60
rounds = 3
vouched = {str(vouched).lower()}

[[kernel]]
id = "relu2"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "good"
source = "good.py"

{tables}[[kernel.testcases]]
spec = "spec.py"
shapes = {shape}
""")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", "build", "--json", "-j", "2"], cwd=root, capture_output=True, text=True
    )
    wall = time.monotonic() - started
    path = root / "workspaces/reports/relu2/compare_report.json"
    if not path.exists():
        return {"error": (proc.stdout + proc.stderr)[-2000:], "wall_s": wall}
    report = json.loads(path.read_text())
    rows = {}
    for row in report["results"]:
        perf = row.get("performance_result") or {}
        rows[row["implementation"]] = {
            "performance_state": row.get("performance_state"),
            "median_us": perf.get("median_us"),
            "p20_us": perf.get("p20_us"),
            "p80_us": perf.get("p80_us"),
            "n": perf.get("n"),
            "calls": perf.get("calls"),
            "round_trip_us": perf.get("round_trip_us"),
            "harness_us_per_call": perf.get("harness_us_per_call"),
            "kernel_us": perf.get("kernel_us"),
            "batch_phases": perf.get("batch_phases"),
            "method": perf.get("method"),
            "speedup": (row.get("speedup") or {}).get("value"),
            "errors": row.get("errors", [])[:3],
        }
    return {"wall_s": wall, "ranking": report.get("ranking"), "rows": rows}


def main() -> int:
    out = {}
    for label, shape in SHAPES.items():
        if sys.argv[2:] and label not in sys.argv[2:]:
            continue
        for vouched in (True, False):
            with tempfile.TemporaryDirectory(prefix="magpie-vouched-") as tmp:
                key = f"{label} {'vouched' if vouched else 'worker timer'}"
                out[key] = build(Path(tmp), shape, vouched)
                result = out[key]
                print(key, f"{result['wall_s']:.0f} s", result.get("ranking"), result.get("error", ""), flush=True)
                for name, row in result.get("rows", {}).items():
                    print(
                        f"  {name:>16} {row['performance_state']} median {row['median_us']} kernel "
                        f"{row['kernel_us']} speedup {row['speedup']} {row['errors'][:1]}",
                        flush=True,
                    )
                    if row["batch_phases"]:
                        print(f"  {'':>16} phases {row['batch_phases']}", flush=True)
                Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
