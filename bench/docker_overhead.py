"""What docker mode adds to a serving benchmark: the test image, a container's life, and the server's start.

    python bench/docker_overhead.py [--rounds 5]

1. The image of this Python environment (`magpie.serving.env_image`): its content key, and its build when
   missing (seconds, size).
2. A container's life through the docker SDK, as docker mode does it (create with host network, IPC and
   init; start; wait; remove), for a command that does nothing (`chown --version`): the fixed cost.
3. `transformers serve` on the tiny offline model, local and docker mode interleaved: seconds until
   `/health` answered and the whole one-shot benchmark (2 requests), median of the rounds.
Prints the figures as JSON; the load average is printed too, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def container_life(client, image: str, rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        t = time.perf_counter()
        container = client.containers.create(
            image, entrypoint=["chown", "--version"], network_mode="host", ipc_mode="host", init=True
        )
        container.start()
        container.wait()
        container.remove(force=True)
        seconds.append(time.perf_counter() - t)
    return seconds


def server_starts(image: str, model: Path, root: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    from magpie.serving.report import BenchmarkConfig
    from magpie.serving.runner import run_benchmark

    out: dict[str, dict[str, list[float]]] = {m: {"ready_s": [], "benchmark_s": []} for m in ("local", "docker")}
    for i in range(rounds):
        for mode in ("local", "docker"):
            report = run_benchmark(
                BenchmarkConfig(
                    framework="transformers",
                    model=str(model),
                    run_mode=mode,
                    docker_image=image if mode == "docker" else None,
                    num_prompts=2,
                    input_len=16,
                    output_len=8,
                    timeout_s=300,
                    output_dir=str(root / f"{mode}{i}"),
                )
            )
            if not report.success:
                raise SystemExit(f"{mode} run {i} failed: {report.errors[0]}")
            out[mode]["ready_s"].append(report.server.ready_after_s)
            out[mode]["benchmark_s"].append(report.execution_time)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import docker

    from magpie.serving import env_image
    from magpie.serving.tiny_model import build

    client = docker.from_env()
    t = time.perf_counter()
    files, key = env_image.contents()
    key_s = time.perf_counter() - t
    ref = f"{env_image.REPOSITORY}:{key}"
    built = not client.images.list(ref)
    t = time.perf_counter()
    env_image.ensure(client)
    build_s = time.perf_counter() - t
    result = {
        "image": ref,
        "files": len(files),
        "key_s": round(key_s, 2),
        "build_s" if built else "found_s": round(build_s, 2),
        "size_gb": round(client.images.get(ref).attrs["Size"] / 1e9, 2),
    }
    life = container_life(client, ref, 10 * args.rounds)
    result["container_life_s"] = {"median": round(statistics.median(life), 3), "max": round(max(life), 3)}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HUB_OFFLINE"] = "1"
        model = build(Path(tmp) / "model")
        starts = server_starts(ref, model, Path(tmp), args.rounds)
    result["serve"] = {
        mode: {
            k: {"median": round(statistics.median(v), 2), "all": [round(x, 2) for x in v]} for k, v in figures.items()
        }
        for mode, figures in starts.items()
    }
    result["loadavg"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
