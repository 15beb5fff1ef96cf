"""What a worker's narrowing (`sandbox.narrow`, its second Landlock layer at its load) costs: in
each of N fresh sandboxes whose project holds its compiler cache and scratch folder (as in
tests/test_narrowing.py), the seconds of the one call. Prints the median, least and most in ms;
figures go to docs/performance.md. Run it under two trees alternating to compare them:

Usage: PYTHONPATH=TREE python bench/narrow_cost.py [N] [LABEL]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from magpie import sandbox


def once(project: str) -> float:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            sandbox.contain(
                sandbox.Policy(
                    write=[os.path.join(project, "cache"), os.path.join(project, "tmp")],
                    read=[project],
                    project=project,
                ),
                fork=False,
            )
            started = time.perf_counter()
            sandbox.narrow([os.path.join(project, "kernel.py")])
            os.write(write, str(time.perf_counter() - started).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        told = answer.read()
    os.waitpid(child, 0)
    if not told:
        raise SystemExit("the sandbox could not be set up or narrowed")
    return float(told)


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    label = sys.argv[2] if len(sys.argv) > 2 else sandbox.__file__
    # a project in the home folder: covered in the sandbox and bound back, as a user's is
    project = os.path.realpath(tempfile.mkdtemp(prefix="narrow-cost-", dir=os.path.expanduser("~")))
    try:
        for folder in ("cache", "tmp"):
            os.makedirs(os.path.join(project, folder))
        with open(os.path.join(project, "kernel.py"), "w") as source:
            source.write("def kernel(x):\n    return x\n")
        seconds = [once(project) for _ in range(repeat)]
    finally:
        shutil.rmtree(project, ignore_errors=True)
    print(
        f"{label}: narrow median {statistics.median(seconds) * 1e3:.3f} ms, least {min(seconds) * 1e3:.3f}, "
        f"most {max(seconds) * 1e3:.3f} ({repeat} sandboxes)"
    )


if __name__ == "__main__":
    main()
