"""The shared cache at 1,000 artifacts: `magpie cache push` of a built project into an empty cache
folder, `magpie cache pull` of all of it into a fresh copy of the sources at another path (every
artifact hashed and its signature checked: by ed25519, the reader's key being another, as a pull
request's runner), the first `magpie build` there (nothing runs), and the builder's own no-op beside
them. Each timed as a whole process over `--runs` runs (a new cache folder and a new copy each run).

The project is bench/noop_build.py's: `--kernels` kernels of 4 implementations judged by a command
testcase, kernels x 13 + 1 artifacts (77: 1,002), built once with the CI key (`--project DIR` keeps
it for later runs).

Usage: python bench/cache_push_pull.py [--kernels 77] [--runs 5] [--project DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noop_build import generate  # noqa: E402


def magpie(args: list[str], cwd: Path, key: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "MAGPIE_SIGNING_KEY": key},
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"magpie {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout + proc.stderr


def row(label: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"| {label} | {statistics.median(ms):.0f} | {min(ms):.0f} | {max(ms):.0f} | {len(ms)} |"


def sources(project: Path, to: Path) -> Path:
    """A fresh clone: the project without its workspace."""
    shutil.copytree(project, to, ignore=shutil.ignore_patterns("workspaces"))
    return to


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=int, default=77, help="77: 1,002 artifacts")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--project", type=Path, help="keep the built project here for later runs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magpie-cache-bench-"))
    project = args.project or work / "project"
    ci_key = (project / ".bench-ci-key").read_text().strip() if (project / ".bench-ci-key").exists() else None
    if ci_key is None:
        ci_key = secrets.token_hex(32)
        project.mkdir(parents=True, exist_ok=True)
        generate(project, args.kernels)
        signer = magpie(["key"], project, ci_key)[1].strip()
        manifest = project / "magpie.toml"
        manifest.write_text(f'[store]\ntrusted_signers = ["{signer}"]\n\n' + manifest.read_text())
        first, _ = magpie(["build", "-j", "2"], project, ci_key)
        print(f"first build: {first:.1f} s")
        (project / ".bench-ci-key").write_text(ci_key)
    _, line = magpie(["build"], project, ci_key)
    artifacts = line.split()[1]
    reader_key = secrets.token_hex(32)
    push, pull, fresh, noop = [], [], [], []
    for run in range(args.runs):
        cache = work / f"cache-{run}"
        took, out = magpie(["cache", "push", "--cache", str(cache), "--cache-write"], project, ci_key)
        push.append(took)
        clone = sources(project, work / f"elsewhere-{run}" / "clone")
        took, out = magpie(["cache", "pull", "--cache", str(cache)], clone, reader_key)
        pull.append(took)
        took, out = magpie(["build"], clone, reader_key)
        assert "artifacts up to date" in out, out
        fresh.append(took)
        noop.append(magpie(["build"], project, ci_key)[0])
        shutil.rmtree(cache)
        shutil.rmtree(clone.parent)
    load = os.getloadavg()
    print(
        f"{artifacts} artifacts, {datetime.date.today()}, {platform.node()}, Python {platform.python_version()}, "
        f"load {load[0]:.1f}"
    )
    print("| step | median ms | min ms | max ms | runs |\n|---|---|---|---|---|")
    print(row("`magpie cache push` into an empty folder", push))
    print(row("`magpie cache pull` into a fresh clone (another signer)", pull))
    print(row("first `magpie build` there (nothing runs)", fresh))
    print(row("the builder's no-op `magpie build`", noop))
    if not args.project:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
