"""Incremental build overhead at a given project size: a generated project (`--kernels` kernels of
`--impls` implementations: kernels x (impls x 3 + 1) + 1 artifacts), built once, then, each timed as
a whole process over `--runs` runs:

- a no-op `magpie build` (everything up to date);
- `magpie build --dry-run` right after one candidate's source was edited (a new edit each run);
- `magpie build` right after one edit, beside the stale tasks' own time (the sum of their `done` lines);
- the first full load (`--dry-run` with the graph snapshot and the last load removed): time and peak memory;
- `doit` through the repository's `dodo.py` (copied into the project), everything up to date and after
  one edit (requirement 3 of issue 44: the same graph through doit's own loader);
- plain doit over as many trivially up-to-date tasks, and `python -c pass`, so the figures can be read
  against the floors.

Usage: python bench/noop_build.py [--kernels 770] [--runs N] [--project DIR]
`--project DIR` keeps the project (and its first build) there for later runs: a 10,000-artifact project
takes minutes to build the first time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPLS = 4


def generate(root: Path, kernels: int, impls: int = IMPLS) -> None:
    lines = ['[project]\nname = "noop-bench"\n']
    for k in range(kernels):
        (root / f"k{k}").mkdir()
        lines.append(f'[[kernel]]\nid = "k{k}"\ntype = "pytorch"\nentry = "f"\n')
        for i in range(impls):
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


def magpie(*args: str) -> list[str]:
    return [sys.executable, "-m", "magpie", *args]


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], cwd: Path, cpu: list[float] | None = None) -> tuple[float, str]:
    """Wall seconds and output; the process's CPU seconds (user + system, its children's too) appended
    to `cpu`: on a busy machine the wall time is mostly waiting for a core, the CPU time much less so."""
    start, used = time.perf_counter(), cpu_of_children()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    if cpu is not None:
        cpu.append(cpu_of_children() - used)
    return time.perf_counter() - start, done.stdout + done.stderr


def timed(cmd: list[str], cwd: Path, runs: int, before=None, cpu: list[float] | None = None) -> list[float]:
    subprocess.run(cmd, cwd=cwd, capture_output=True, check=True)  # warm the page cache
    samples = []
    for n in range(runs):
        if before is not None:
            before(n)
        samples.append(run(cmd, cwd, cpu)[0])
    return samples


def edit(root: Path, counter: list[int]):
    """Each call edits another candidate's source (a new line of its own: a new key every time)."""

    def apply(_run: int) -> Path:
        counter[0] += 1
        path = root / f"k{counter[0] % 7}/v1.py"
        path.write_text(path.read_text() + f"# edit {counter[0]} {time.time_ns()}\n")
        return path

    return apply


def row(label: str, samples: list[float], cpu: list[float] | None = None) -> str:
    used = f"{statistics.median(cpu) * 1000:.0f}" if cpu else ""
    return (
        f"| {label} | {statistics.median(samples) * 1000:.0f} | {min(samples) * 1000:.0f} | "
        f"{max(samples) * 1000:.0f} | {used} | {len(samples)} |"
    )


def task_seconds(output: str) -> float:
    """The stale tasks' own time: the sum of the build's `done  TASK  ...  1.2s` lines."""
    return sum(float(m) for m in re.findall(r"^done  .*?(\d+\.\d)s$", output, re.MULTILINE))


def bench(root: Path, runs: int, first: float | None) -> list[str]:
    count = json.loads(subprocess.run(magpie("build", "--json"), cwd=root, capture_output=True, text=True).stdout)[
        "up_to_date"
    ]
    counter = [0]
    noop_cpu: list[float] = []
    dry_cpu: list[float] = []
    bare_cpu: list[float] = []
    noop = timed(magpie("build"), root, runs, cpu=noop_cpu)
    dry = timed(magpie("build", "--dry-run"), root, runs, before=edit(root, counter), cpu=dry_cpu)
    builds, own, build_cpu = [], [], []
    for n in range(runs):
        edit(root, counter)(n)
        seconds, output = run(magpie("build", "--plain"), root, build_cpu)
        builds.append(seconds)
        own.append(task_seconds(output))
    overhead = [b - o for b, o in zip(builds, own, strict=True)]
    workspace = root / "workspaces"
    cold, peak = [], 0
    for _ in range(max(3, runs // 3)):
        for cache in workspace.glob("graph-*"):
            cache.unlink()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        cold.append(run(magpie("build", "--dry-run"), root)[0])
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    run(magpie("build"), root)  # the snapshot again
    shutil.copy(Path(__file__).resolve().parents[1] / "dodo.py", root / "dodo.py")
    dodo_cpu: list[float] = []
    dodo_edit: list[float] = []
    dodo_edit_cpu: list[float] = []
    dodo = timed([sys.executable, "-m", "doit"], root, runs, cpu=dodo_cpu)
    for n in range(runs):
        edit(root, counter)(n)
        dodo_edit.append(run([sys.executable, "-m", "doit"], root, dodo_edit_cpu)[0])
    (root / "dodo.py").unlink()
    run(magpie("build"), root)
    with tempfile.TemporaryDirectory() as tmp:
        doit_root = Path(tmp)
        plain_doit_project(doit_root, count)
        doit_cpu: list[float] = []
        doit_noop = timed([sys.executable, "-m", "doit"], doit_root, runs, cpu=doit_cpu)
    bare = timed([sys.executable, "-c", "pass"], root, runs, cpu=bare_cpu)
    load = os.getloadavg()
    lines = [
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {datetime.date.today()}; load average {load[0]:.1f}",
        f"artifacts: {count}" + (f"; first build {first:.1f} s with -j {os.cpu_count()}" if first else ""),
        "",
        "| whole process | median ms | min ms | max ms | median CPU ms | runs |",
        "|---|---:|---:|---:|---:|---:|",
        row(f"no-op `magpie build`, {count} artifacts up to date", noop, noop_cpu),
        row("`magpie build --dry-run` after one edit", dry, dry_cpu),
        row("`magpie build` after one edit (CPU: its job processes' too)", builds, build_cpu),
        row("... of it the stale tasks' own time (their `done` lines)", own),
        row("... the rest: `magpie build` after one edit less its tasks' time", overhead),
        row("first full load: `--dry-run`, snapshot and last load removed", cold),
        row(f"`doit` through dodo.py, {count} artifacts up to date", dodo, dodo_cpu),
        row("`doit` through dodo.py after one edit (its tasks run inline)", dodo_edit, dodo_edit_cpu),
        row(f"plain `doit`, {count} trivially up-to-date tasks", doit_noop, doit_cpu),
        row("`python -c pass`", bare, bare_cpu),
        "",
        f"first full load's peak memory: {peak / 1024:.0f} MiB (max RSS of a process)",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=77, help="77: 1,002 artifacts; 770: 10,011; 7,700: 100,101")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--project", type=Path, help="keep the project here (built once, reused by later runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.project or Path(tmp) / "project"
        first = None
        if not (root / "magpie.toml").exists():
            root.mkdir(parents=True, exist_ok=True)
            generate(root, args.kernels)
            first = run(magpie("build", "-j", str(os.cpu_count()), "--plain"), root)[0]
        print("\n".join(bench(root, args.runs, first)))
        if args.project is None:
            shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
