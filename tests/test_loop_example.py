"""examples/loop/ run through to its A/B as the README walks it (issue 43, point 8), then read by `magpie loop`: the
e2e stage from the A/B's own result (claim, gate, B/A with its interval), and after an edit of the candidate the
comparison and the A/B stale with the comparison's rebuild the next step. The A/B's mechanism and evidence are
tests/test_ab_benchmark.py's; this is the loop's reading of a real one. Minutes: one build, in a slow test."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import magpie, magpie_in_process
from loop_fixtures import two_free_ports

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "loop"
pytestmark = pytest.mark.timeout(900)  # a benchmark and an A/B (three server starts) on two busy cores


def _status(root: Path) -> dict:
    proc = magpie_in_process("loop", "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_loop_reads_the_examples_ab_and_an_edit_makes_it_stale(tmp_path, tiny_model):
    root = tmp_path / "loop"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("workspaces", "models"))
    shutil.copytree(tiny_model, root / "models" / "tiny")
    manifest = root / "magpie.toml"
    manifest.write_text(re.sub(r"^port = \d+", f"port = {two_free_ports()}", manifest.read_text(), flags=re.M))
    proc = magpie("build", "benchmark:tiny", "benchmark_ab:tiny", cwd=root, check=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    status = _status(root)
    stages = {s["name"]: s for s in status["stages"]}
    assert stages["baseline"]["state"] == "done" and "output tok/s" in stages["baseline"]["detail"]
    assert stages["e2e"]["state"] in ("done", "stale"), status  # stale only where a timing was inconclusive
    stored = sorted((root / "workspaces").rglob("ab_report.json"))
    report = json.loads(stored[-1].read_text())
    assert stages["e2e"]["detail"].startswith(f"{report['claim']}; gate passed"), (stages["e2e"], report["claim"])
    measured = [m for m, change in report["metrics"].items() if change["ratio"] is not None]
    assert measured and sum(f"{m} x" in stages["e2e"]["detail"] for m in measured) == min(3, len(measured)), stages[
        "e2e"
    ]

    source = root / "rmsnorm" / "written_out.py"
    source.write_text(source.read_text() + "\n# edited\n")
    after = _status(root)
    stages = {s["name"]: s for s in after["stages"]}
    assert stages["candidates"]["state"] == "stale" and stages["e2e"]["state"] == "stale", after
    assert {"comparison:rmsnorm", "benchmark_ab:tiny"} <= set(after["stale"])
    assert "benchmark:tiny" not in after["stale"]  # the plain benchmark's key holds no kernel
    assert after["next_step"]["command"] == "magpie build comparison:rmsnorm"
