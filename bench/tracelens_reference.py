"""Write TraceLens's own outputs for fixture traces: the references of tests/test_tracelens_parity.py.

For each trace, runs TraceLens's `generate_perf_report_pytorch` from a checkout at the pinned
commit (171dd747, as tests/fixtures/tracelens_ops.json) with the H200 peaks of
tests/fixtures/tracelens/h200_arch.json, and keeps its CSVs, gzipped, as
tests/fixtures/tracelens/<trace name>/<table>.csv.gz. TraceLens runs on the CPU; run this script with a
Python that has its requirements (pandas, matplotlib...). On train_step_mlp it rewrites the committed
references byte for byte.

Usage, from the repository root, after bench/capture_traces.py on the GPU:

    git clone https://github.com/AMD-AGI/TraceLens /tmp/TraceLens
    git -C /tmp/TraceLens checkout 171dd74721ca1ec45709e5805b68ae1f65e27811
    cp CAPTURED/op_coverage.json.gz tests/fixtures/traces/h200/
    python -m venv --system-site-packages /tmp/tlvenv && /tmp/tlvenv/bin/pip install matplotlib
    /tmp/tlvenv/bin/python bench/tracelens_reference.py /tmp/TraceLens tests/fixtures/traces/h200/op_coverage.json.gz
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "fixtures" / "tracelens"
PINNED = "171dd74721ca1ec45709e5805b68ae1f65e27811"


def reference(checkout: Path, trace: Path) -> Path:
    name = trace.name.removesuffix(".gz").removesuffix(".json")
    target = REFERENCE / name
    with tempfile.TemporaryDirectory() as scratch:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "TraceLens.Reporting.generate_perf_report_pytorch",
                "--profile_json_path",
                str(trace),
                "--output_csvs_dir",
                scratch,
                "--gpu_arch_json_path",
                str(REFERENCE / "h200_arch.json"),
            ],
            cwd=scratch,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if run.returncode:
            last = (run.stderr.strip().splitlines() or ["no message"])[-1]
            raise SystemExit(f"{trace}: TraceLens failed ({last}); run this with a Python that has its requirements")
        tables = sorted(Path(scratch).glob("*.csv"))
        if not tables:
            raise SystemExit(f"{trace}: TraceLens wrote no CSV")
        target.mkdir(parents=True, exist_ok=True)
        for table in tables:
            with open(table, "rb") as src, gzip.GzipFile(target / f"{table.name}.gz", "wb", mtime=0) as dst:
                dst.write(src.read())
    return target


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python bench/tracelens_reference.py TRACELENS_CHECKOUT TRACE...", file=sys.stderr)
        return 2
    checkout = Path(argv[0]).resolve()
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if commit != PINNED:
        print(
            f"{checkout} is at {commit[:12]}; the references are TraceLens {PINNED[:12]}'s: check it out first",
            file=sys.stderr,
        )
        return 2
    for trace in argv[1:]:
        target = reference(checkout, Path(trace).resolve())
        print(target.relative_to(ROOT), ", ".join(sorted(p.name for p in target.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
