"""No-op build overhead: a generated project of ~1,000 artifacts, built once, then
`magpie build` timed as a whole process while everything is up to date.

Beside it, the same number of up-to-date tasks under plain doit, and the bare interpreter,
so the figure can be read against the floor. Usage: python bench/noop_build.py [--runs N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNELS = 77  # x (4 implementations x 3 tasks + 1 comparison) + 1 report = 1,002 artifacts
IMPLS = 4


def generate(root: Path) -> None:
    lines = ['[project]\nname = "noop-bench"\n']
    for k in range(KERNELS):
        (root / f"k{k}").mkdir()
        lines.append(f'[[kernel]]\nid = "k{k}"\ntype = "pytorch"\nentry = "f"\n')
        for i in range(IMPLS):
            (root / f"k{k}/v{i}.py").write_text(f"def f(x):\n    return x + {i}\n")
            table = "[kernel.baseline]" if i == 0 else "[[kernel.candidates]]"
            lines.append(f'{table}\nid = "v{i}"\nsource = "k{k}/v{i}.py"\n')
        lines.append('[[kernel.testcases]]\ncommand = "true"\n')
    (root / "magpie.toml").write_text("\n".join(lines))


def plain_doit_project(root: Path, count: int) -> None:
    (root / "dodo.py").write_text(
        "DOIT_CONFIG = {'verbosity': 0}\n"
        "def task_t():\n"
        f"    for i in range({count}):\n"
        "        yield {'name': str(i), 'actions': [lambda: True], 'uptodate': [True]}\n"
    )


def timed(cmd: list[str], cwd: Path, runs: int) -> list[float]:
    subprocess.run(cmd, cwd=cwd, capture_output=True, check=True)  # warm the page cache
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return samples


def row(label: str, samples: list[float]) -> str:
    return (
        f"| {label} | {statistics.median(samples) * 1000:.0f} | {min(samples) * 1000:.0f} | "
        f"{max(samples) * 1000:.0f} | {len(samples)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        generate(root)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "magpie", "build", "-j", str(os.cpu_count()), "--plain"],
            cwd=root,
            capture_output=True,
            check=True,
        )
        first = time.perf_counter() - start
        count = json.loads(
            subprocess.run(
                [sys.executable, "-m", "magpie", "build", "--json"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["up_to_date"]
        magpie_noop = timed([sys.executable, "-m", "magpie", "build"], root, args.runs)
        snapshot = root / "workspaces" / "graph-snapshot.json"
        cold = []
        for _ in range(max(3, args.runs // 3)):
            snapshot.unlink()
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "magpie", "build"], cwd=root, capture_output=True, check=True)
            cold.append(time.perf_counter() - start)
        doit_root = Path(tmp) / "doit"
        doit_root.mkdir()
        plain_doit_project(doit_root, count)
        doit_noop = timed([sys.executable, "-m", "doit"], doit_root, args.runs)
        bare = timed([sys.executable, "-c", "pass"], root, args.runs)
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {datetime.date.today()}"
    )
    print(f"artifacts: {count}; first build {first:.1f} s with -j {os.cpu_count()}\n")
    print("| no-op, whole process | median ms | min ms | max ms | runs |\n|---|---:|---:|---:|---:|")
    print(row(f"`magpie build`, {count} artifacts up to date", magpie_noop))
    print(row("`magpie build`, snapshot removed (full manifest load and hashing)", cold))
    print(row(f"plain `doit`, {count} up-to-date tasks", doit_noop))
    print(row("`python -c pass`", bare))
    return 0


if __name__ == "__main__":
    sys.exit(main())
