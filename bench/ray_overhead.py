"""Ray's overhead per job (docs/performance.md): the wall time from a job's submission to its
result, less the time the job ran (`task_seconds`), through the Ray executor on a local Ray;
reused workers (Ray's default) and a fresh worker per job (`max_calls=1`), against the local
process pool. The job is a shell-command rule running `true` (sandboxed, as in a build).

    python bench/ray_overhead.py [--jobs 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray

from magpie.execution import ray_executor
from magpie.execution.executors import LocalProcessExecutor
from magpie.execution.job import Job
from magpie.graph.expand import TaskSpec


def job(root: Path, index: int) -> Job:
    spec = TaskSpec(
        name=f"compile:k/{index}",
        rule="compile",
        scope="impl",
        action="true",
        kernel="k",
        impl=None,
        inputs=[],
        config={},
        fingerprint={},
        deps=[],
        params={"root": str(root), "settings": {}},
    )
    return Job(spec, {}, {})


def overheads(executor, root: Path, jobs: int) -> list[float]:
    executor.submit(job(root, -1)).result()  # the first: imports in the worker
    found = []
    for index in range(jobs):
        started = time.monotonic()
        output = executor.submit(job(root, index)).result()
        found.append(time.monotonic() - started - output.result["task_seconds"])
    return found


def line(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{name}: median {statistics.median(ms):.1f} ms, min {ms[0]:.1f}, max {ms[-1]:.1f} (n={len(ms)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    pool = LocalProcessExecutor(1)
    try:
        print(line("local process pool", overheads(pool, root, args.jobs)))
    finally:
        pool.shutdown()
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init (embedded local Ray): {time.monotonic() - started:.1f} s")
    executor = ray_executor.RayExecutor(1)
    try:
        print(line("ray, reused workers", overheads(executor, root, args.jobs)))
        executor._remote = ray.remote(max_calls=1)(ray_executor.run_on_worker)  # a new worker process per job
        print(line("ray, a fresh worker per job", overheads(executor, root, args.jobs)))
    finally:
        executor.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
