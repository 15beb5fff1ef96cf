"""Helpers of the tests of issue 43's loop (tests/test_ab_benchmark.py, tests/test_workload_replacement.py): the
RMSNorm kernel's files (tests/fixtures/loop/), a project serving the tiny model with it, ports for two servers."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "loop"
TARGET = "transformers.models.llama.modeling_llama.LlamaRMSNorm.forward"


def two_free_ports() -> int:
    """A port whose next one is free too (the A/B's servers listen on both), below Linux's ephemeral range: a
    health poll of a port in that range before its server listens can connect to itself."""
    import random
    import socket

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for _ in range(100):
        port = random.randrange(20000, 32000)
        if free(port) and free(port + 1):
            return port
    raise AssertionError("no two adjacent free ports")


def loop_project(root: Path, tiny_model: Path, benchmarks: dict[str, str], kernels: str = "") -> Path:
    """A project serving the tiny model with the rmsnorm kernel (baseline, fused, rank2_only) and one benchmark
    per entry of `benchmarks` (id -> the implementation `use` names), each on ports of its own."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("spec.py", "baseline.py", "fused.py", "rank2_only.py"):
        shutil.copy(FIXTURES / name, root / name)
    shutil.copytree(tiny_model, root / "models" / "tiny")
    text = f"""
[project]
name = "loop"

[defaults.timing]
warmup_ms = 5
budget_ms = 60
rounds = 3

[[kernel]]
id = "rmsnorm"
type = "pytorch"
entry = "rmsnorm"
replaces = "{TARGET}"
replaces_with = "forward"
baseline = {{ id = "torch", source = "baseline.py" }}
candidates = [{{ id = "fused", source = "fused.py" }}, {{ id = "rank2_only", source = "rank2_only.py" }}]

[[kernel.testcases]]
spec = "spec.py"
shapes = [[8, 64]]
{kernels}
"""
    for bench_id, use in benchmarks.items():
        text += f"""
[[benchmark]]
id = "{bench_id}"
engine = "transformers"
model = "models/tiny"
port = {two_free_ports()}
timeout_s = 300
use = {use}

[benchmark.load]
concurrency = 2
input_len = 8
output_len = 4
num_prompts = 2

[benchmark.ab]
gate_prompts = 4
gate_max_tokens = 8
"""
    (root / "magpie.toml").write_text(text)
    return root
