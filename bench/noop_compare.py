"""No-op builds of one project under two versions of magpie, side by side.

Each version is a source tree (a checkout, or `git archive COMMIT | tar -x -C DIR`) run through
PYTHONPATH. The example project (`magpie.toml` above this folder) is copied once per version and
built by it, with a signing key of the run's own, unless --built gives folders already built (with
the environment's key, which signed them: `XDG_CONFIG_HOME`, `MAGPIE_SIGNING_KEY`); then the runs alternate
between the two versions: `magpie build` as a whole process with everything up to date, then with
the graph snapshot removed before each run (the full load, every artifact checked). Wall and CPU
time (user + system of the process and its children) per run; the medians are printed, with
`python -c pass` beside them to read a loaded machine by. Last, the store's signing primitives of
the second version (`magpie.store.signing`) where it has them.

Usage: python bench/noop_compare.py OLD_TREE NEW_TREE [--runs 10] [--built OLD_DIR NEW_DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(cmd)} in {cwd} failed ({status})")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def copy_example(target: Path) -> None:
    """The example manifest and what it names: the softmax kernels and the declared H200 traces."""
    for name in ("kernels", "tests/fixtures/traces/h200"):
        shutil.copytree(EXAMPLE / name, target / name, symlinks=True)
    shutil.copy(EXAMPLE / "magpie.toml", target / "magpie.toml")


def line(name: str, samples: list[tuple[float, float]]) -> str:
    wall, cpu = [w * 1000 for w, _ in samples], [c * 1000 for _, c in samples]
    return (
        f"| {name} | {statistics.median(wall):.0f} | {min(wall):.0f} | {max(wall):.0f} | "
        f"{statistics.median(cpu):.0f} | {len(samples)} |"
    )


def primitives(env: dict) -> None:
    code = """
import time
from magpie.store import signing
message = signing.artifact_message("timing:k/x", "ab" * 32, {"result.json": [4000, "cd" * 32]})
start = time.perf_counter(); signed = signing.sign(message); first = time.perf_counter() - start
def each(f, n=2000):
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6
print(f"first signature (cryptography imported): {first * 1000:.0f} ms; each: sign "
      f"{each(lambda: signing.sign(message)):.0f} us, check the signature "
      f"{each(lambda: signing.signature_valid(signed['signer'], signed['signature'], message)):.0f} us, check the MAC "
      f"{each(lambda: signing.artifact_mac(message, signed['signer'], signed['signature'])):.1f} us")
"""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    print(proc.stdout.strip() or f"(no signing primitives: {proc.stderr.strip().splitlines()[-1]})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path, help="the two versions' source trees (old, new)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--built", nargs=2, type=Path, help="the project built already by each version")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        envs = [{"PYTHONPATH": str(tree.resolve())} for tree in args.trees]
        if not args.built:  # a signing key of this run's (a project built before keeps the user's, which signed it)
            for env in envs:
                env["XDG_CONFIG_HOME"] = str(Path(tmp) / "config")
        projects = [path.resolve() for path in args.built] if args.built else []
        if not projects:
            for i, env in enumerate(envs):
                projects.append(Path(tmp) / f"project-{i}")
                copy_example(projects[-1])
                timed([sys.executable, "-m", "magpie", "build"], projects[-1], env)
        build = [sys.executable, "-m", "magpie", "build"]
        for project, env in zip(projects, envs):
            timed(build, project, env)  # whatever a first run after the build writes
        print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores; old {args.trees[0]}, new {args.trees[1]}\n")
        print("| run | wall median ms | min | max | CPU median ms | runs |\n|---|---:|---:|---:|---:|---:|")
        for cold in (False, True):
            samples: list[list] = [[], []]
            for _ in range(args.runs):
                for i, (project, env) in enumerate(zip(projects, envs)):
                    if cold:
                        (project / "workspaces/graph-snapshot.json").unlink()
                    samples[i].append(timed(build, project, env))
            what = "snapshot removed" if cold else "no-op"
            print(line(f"old, {what}", samples[0]))
            print(line(f"new, {what}", samples[1]))
        bare = [timed([sys.executable, "-c", "pass"], Path(tmp), {}) for _ in range(args.runs)]
        print(line("`python -c pass`", bare))
        print()
        primitives(envs[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
