"""`magpie loop` (issue 43, point 6): where a project's optimization loop stands, what is stale, the next step. The
project is the loop's RMSNorm kernel (tests/fixtures/loop/) with a [[benchmark]] using it; its kernel steps are
built for real (cheap on the CPU), the serving steps are read as never built (their servers take minutes: the A/B
itself is tests/test_ab_benchmark.py's)."""

from __future__ import annotations

import json

import pytest
from conftest import magpie_in_process
from loop_fixtures import loop_project


def _project(root, uses='{ rmsnorm = "best" }', profiler=False):
    model = root.parent / f"{root.name}_model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # the model folder is an input here, never served
    root = loop_project(root, model, {"good": uses})
    if profiler:
        text = (root / "magpie.toml").read_text()
        (root / "magpie.toml").write_text(text.replace('id = "good"\n', 'id = "good"\nprofiler = true\n'))
    return root


def _status(root, *args):
    proc = magpie_in_process("loop", "--json", *args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _stage(status, name):
    return next(s for s in status["stages"] if s["name"] == name)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """The project with its kernel's comparison built (the candidates judged), the serving steps never built."""
    root = _project(tmp_path_factory.mktemp("loop") / "proj")
    before = _status(root)
    proc = magpie_in_process("build", "comparison:rmsnorm", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, before


def test_before_any_build_the_next_step_is_the_baseline(judged):
    _, status = judged
    assert [s["name"] for s in status["stages"]] == ["baseline", "bottlenecks", "kernels", "candidates", "e2e"]
    assert _stage(status, "baseline")["state"] == "missing"
    assert status["next_step"]["command"] == "magpie build benchmark:good"
    assert _stage(status, "kernels")["state"] == "done"
    assert "LlamaRMSNorm.forward" in _stage(status, "kernels")["detail"]
    assert _stage(status, "bottlenecks")["state"] == "not declared"
    assert status["stale"]["benchmark_ab:good"] == "never built"


def test_json_keys_are_pinned(judged):
    _, status = judged
    assert sorted(status) == ["benchmark", "next_step", "project", "stages", "stale"]
    assert sorted(status["stages"][0]) == ["detail", "name", "state", "tasks"]
    assert sorted(status["next_step"]) == ["command", "stage", "why"]


def test_judged_candidates_name_the_winner_and_an_edit_makes_them_stale(judged, tmp_path):
    root, _ = judged
    status = _status(root)
    candidates = _stage(status, "candidates")
    # stale only where the busy machine left a timing inconclusive, which the dry run measures again too
    plan = magpie_in_process("build", "--dry-run", "comparison:rmsnorm", cwd=root).stdout
    assert candidates["state"] == ("stale" if "would run  comparison:rmsnorm" in plan else "done"), (status, plan)
    assert candidates["detail"].startswith(("rmsnorm: winner ", "rmsnorm: no winner")), candidates
    # the build's own staleness: an edit of a candidate's source makes its comparison stale, with the dry run's reason
    import shutil

    copy = tmp_path / "proj"
    shutil.copytree(root, copy, symlinks=True)
    (copy / "fused.py").write_text((copy / "fused.py").read_text() + "\n# edited\n")
    after = _status(copy)
    assert _stage(after, "candidates")["state"] == "stale"
    plan = magpie_in_process("build", "--dry-run", "comparison:rmsnorm", cwd=copy).stdout
    assert f"would run  comparison:rmsnorm  ({after['stale']['comparison:rmsnorm']})" in plan, (after, plan)
    assert "fused.py" in after["stale"]["compile:rmsnorm/fused"], after["stale"]  # the edit, as the dry run says
    assert "compile:rmsnorm/rank2_only" not in after["stale"]


def test_text_table_ends_with_the_next_step(judged):
    root, _ = judged
    proc = magpie_in_process("loop", cwd=root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "loop of loop, benchmark good"
    assert any(line.startswith("candidates") and "done" in line for line in lines)
    assert "next: magpie build benchmark:good" in proc.stdout


def test_a_benchmark_using_no_kernel_is_told_to_declare_one_from_its_trace(tmp_path):
    root = _project(tmp_path / "proj", uses="{}", profiler=True)
    status = _status(root)
    assert _stage(status, "bottlenecks")["state"] == "missing"
    assert _stage(status, "bottlenecks")["tasks"] == ["benchmark_profile:good", "benchmark_trace_analysis:good"]
    assert _stage(status, "kernels")["state"] == "missing"
    assert _stage(status, "e2e")["state"] == "not declared"
    assert status["next_step"]["command"] == "magpie build benchmark:good"


def test_bad_input_is_one_line_exit_2(tmp_path):
    proc = magpie_in_process("loop", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "magpie.toml: file not found" in proc.stderr
    root = _project(tmp_path / "proj")
    text = (root / "magpie.toml").read_text()
    (root / "magpie.toml").write_text(text[: text.index("[[benchmark]]")])
    proc = magpie_in_process("loop", cwd=root)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no [[benchmark]]" in proc.stderr
    (root / "magpie.toml").write_text(text)
    proc = magpie_in_process("loop", "-b", "nope", cwd=root)
    assert proc.returncode == 2 and "no [[benchmark]] 'nope'" in proc.stderr and proc.stderr.count("\n") == 1


def test_importing_the_loop_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, magpie.execution.loop, magpie.cli.loop; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_example_project_loads_and_its_loop_starts_at_the_baseline(tmp_path, tiny_model):
    """examples/loop/ (point 8) as a new user has it after making the model: its manifest loads, and `magpie loop`
    before any build answers the first step. Its full run is tests/test_ab_benchmark.py's mechanism."""
    import shutil
    from pathlib import Path

    from magpie.project import Project

    root = tmp_path / "loop"
    example = Path(__file__).resolve().parent.parent / "examples" / "loop"
    shutil.copytree(example, root, ignore=shutil.ignore_patterns("workspaces", "models"))
    shutil.copytree(tiny_model, root / "models" / "tiny")
    project = Project.load(root / "magpie.toml")
    assert {"comparison:rmsnorm", "benchmark:tiny", "benchmark_ab:tiny"} <= set(project.tasks)
    status = _status(root)
    assert status["next_step"]["command"] == "magpie build benchmark:tiny"
    assert [s["state"] for s in status["stages"]] == ["missing", "not declared", "done", "missing", "missing"]
