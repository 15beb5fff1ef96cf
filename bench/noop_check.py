"""What `--check` and `--json` add to a no-op build: noop_build.py's generated project (1,002
artifacts, 77 comparisons), built once, then `magpie build`, `magpie build --check` and
`magpie build --check --json` timed as whole processes, interleaved, beside the bare
interpreter. Usage: python bench/noop_check.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noop_build import generate  # noqa: E402

VARIANTS = {
    "magpie build": [],
    "magpie build --check": ["--check"],
    "magpie build --check --json": ["--check", "--json"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        generate(root)
        subprocess.run(
            [sys.executable, "-m", "magpie", "build", "-j", "2", "--plain"], cwd=root, capture_output=True, check=True
        )
        seconds: dict[str, list[float]] = {name: [] for name in [*VARIANTS, "python -c pass"]}
        for _ in range(args.runs):
            for name, flags in VARIANTS.items():
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "magpie", "build", *flags], cwd=root, capture_output=True)
                seconds[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"])
            seconds["python -c pass"].append(time.perf_counter() - started)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs each, interleaved")
    for name, times in seconds.items():
        print(
            f"{name}: median {statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f}, "
            f"max {max(times) * 1000:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
