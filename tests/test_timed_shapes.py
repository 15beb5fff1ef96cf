"""`timing.shapes` (issue 37.7): a kernel timed on several shapes gets a speedup per shape, each
with the baseline median it was computed from, and their geometric mean, shown per shape in
compare_report.json, the reports and `magpie compare`'s table; a timed shape the testcase does
not declare is one line; a shape added only to be checked re-runs correctness, not the timings."""

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, build_json, copy_project, magpie_in_process, relu2_project

from magpie.cli.compare import table
from magpie.harness.timed_shapes import combined
from magpie.report.verdicts import task_line
from magpie.supervision.step_limit import TIMING_BUDGET_FACTOR, step_limit_s

SHAPES = "[[8, 16], [4, 32]]"
# the timed pair's budget (tests/conftest.py): a smaller one once read an honest copy's calls at half the baseline's
TIMING = f"warmup_ms = 5\nbudget_ms = 60\nrounds = 3\nshapes = {SHAPES}"
LABELS = ["[8, 16] float32", "[4, 32] float32"]


@pytest.fixture(scope="module")
def two_shapes(tmp_path_factory) -> Path:
    """The baseline and `fast` (a copy of it) timed on both declared shapes, built once at -j 1."""
    root = tmp_path_factory.mktemp("two_shapes")
    shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
    relu2_project(root, ["fast"], SHAPES, defaults="trials = 1", timing=TIMING)
    assert build_json(root)["failed"] == []
    return root


def compare_report(root: Path) -> dict:
    return json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())


def test_each_timed_shape_has_its_speedup_and_the_row_their_geometric_mean(two_shapes):
    report = compare_report(two_shapes)
    assert report["timed_shapes"] == LABELS
    rows = {row["implementation"]: row for row in report["results"]}
    fast = rows["fast"]
    assert [shape["shape"] for shape in fast["shapes"]] == LABELS
    assert all(shape["performance_state"] == "SUCCESS" for shape in fast["shapes"])
    speedups = [shape["speedup"] for shape in fast["shapes"]]
    assert all(s["baseline_median_us"] > 0 for s in speedups)
    summary = fast["shapes_summary"]
    assert summary["shapes"] == 2 and "geometric mean" in summary["method"]
    for key in ("value", "ci_low", "ci_high"):
        assert summary[key] == pytest.approx(math.sqrt(speedups[0][key] * speedups[1][key]))
    assert fast["speedup"]["value"] == pytest.approx(summary["value"])  # what ranks it
    # the first shape's keys as one shape's timing has them
    assert fast["performance_result"]["shape"] == LABELS[0]
    assert [shape["shape"] for shape in rows["good"]["shapes"]] == LABELS


def test_the_reports_and_the_compare_table_show_a_row_per_shape(two_shapes):
    summary = (two_shapes / "workspaces/reports/summary.md").read_text()
    html = (two_shapes / "workspaces/reports/report.html").read_text()
    printed = table(compare_report(two_shapes))
    for label in LABELS:
        assert f"| ↳ {label} |" in summary
        assert f'data-shape="{label}"' in html
        assert any(line.strip().startswith(label) for line in printed.splitlines())
    assert "(geometric mean of 2 shapes)" in summary and "(geometric mean of 2 shapes)" in printed
    assert "vs baseline" in printed.split(LABELS[1], 1)[1]  # each shape's speedup says its baseline median
    stored = [json.loads(path.read_text()) for path in (two_shapes / "workspaces/store").glob("*/*/result.json")]
    (timing,) = [result for result in stored if result.get("task") == "timing:relu2/fast"]
    line = task_line("timing", timing)  # its `done` line
    assert "(geometric mean of 2 shapes)" in line and line.endswith(f"µs on {LABELS[0]}")


def test_a_shape_added_only_for_correctness_leaves_the_timings_up_to_date(two_shapes, tmp_path):
    root = copy_project(two_shapes, tmp_path / "added")
    manifest = root / "magpie.toml"
    # the testcase's shapes, declared after the timing's
    head, tail = manifest.read_text().rsplit(f"shapes = {SHAPES}\n", 1)
    manifest.write_text(f"{head}shapes = [[8, 16], [4, 32], [2, 8]]\n{tail}")
    plan = json.loads(magpie_in_process("build", "--dry-run", "--json", cwd=root, check=0).stdout)
    stale = [row["task"] for row in plan["would_run"]]
    assert "correctness:relu2/fast" in stale and "correctness:relu2/good" in stale
    assert not [task for task in stale if task.startswith("timing:")], plan["would_run"]
    # and the build, once the correctness steps ran again to the same verdicts, times nothing
    built = json.loads(magpie_in_process("build", "--json", cwd=root, check=0).stdout)
    assert built["failed"] == [] and "correctness:relu2/fast" in built["executed"]
    assert not [task for task in built["executed"] if task.startswith("timing:")], built["executed"]


def test_compare_refuses_a_timed_shape_it_is_not_given_in_one_line(tmp_path):
    for name in ("good", "spec"):
        shutil.copy(FIXTURES / f"adversarial/{name}.py", tmp_path / f"{name}.py")
    shutil.copy(FIXTURES / "adversarial/good.py", tmp_path / "fast.py")
    flags = ["--type", "pytorch", "--entry", "kernel", "--spec", "spec.py", "--shapes", "8x16"]
    proc = magpie_in_process("compare", "good.py", "fast.py", *flags, "--timed-shapes", "3x3", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "magpie: --timed-shapes: 3x3 is not among --shapes (8x16)"


ODD = """import torch


def kernel(x):
    y = torch.relu(x) * 2.0
    return y + 1.0 if x.shape[0] == 2 else y
"""


def test_a_correctness_verdict_that_changes_times_the_implementation_then(tmp_path):
    """The timing reads its correctness step's verdict alone (a gate): one run again to another verdict
    re-keys it. `odd` is wrong on two rows only: not timed; that shape dropped, it is correct and timed."""
    (tmp_path / "odd.py").write_text(ODD)
    relu2_project(tmp_path, ["odd"], "[[8, 16], [2, 8]]", defaults="trials = 1", timing=TIMING.rsplit("\n", 1)[0])
    assert build_json(tmp_path)["failed"] == []
    assert compare_report(tmp_path)["results"][1]["performance_state"] == "SKIPPED"
    manifest = tmp_path / "magpie.toml"
    manifest.write_text(manifest.read_text().replace("shapes = [[8, 16], [2, 8]]", "shapes = [[8, 16]]"))
    built = build_json(tmp_path)
    assert "timing:relu2/odd" in built["executed"] and "timing:relu2/good" not in built["executed"]
    odd = next(row for row in compare_report(tmp_path)["results"] if row["implementation"] == "odd")
    assert odd["correctness_state"] == odd["performance_state"] == "SUCCESS"


def test_a_timed_shape_the_testcase_does_not_declare_is_one_line(tmp_path):
    shutil.copy(FIXTURES / "adversarial/good.py", tmp_path / "fast.py")
    relu2_project(tmp_path, ["fast"], SHAPES, timing="shapes = [[3, 5]]")
    proc = magpie_in_process("build", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "timing.shapes [3, 5] is not a shape of its first spec testcase" in lines[0]


@pytest.mark.gpu
def test_on_a_gpu_each_timed_shape_is_timed_in_the_method_chosen_for_it(tmp_path):
    """A small shape (graph replays, under 10 µs) and a large one (events): the baseline's timing of
    each shape chooses that shape's method, and the candidate is timed in it, shape by shape."""
    shutil.copy(FIXTURES / "adversarial/good.py", tmp_path / "fast.py")
    shapes = "[[8, 16], [4096, 4096]]"
    timing = f"warmup_ms = 5\nbudget_ms = 60\nrounds = 3\nshapes = {shapes}"
    relu2_project(tmp_path, ["fast"], shapes, defaults="trials = 1", device="cuda", timing=timing)
    assert build_json(tmp_path)["failed"] == []
    rows = {row["implementation"]: row for row in compare_report(tmp_path)["results"]}
    methods = [shape["timing_method"]["mode"] for shape in rows["good"]["shapes"]]
    assert [shape["timing_method"]["mode"] for shape in rows["fast"]["shapes"]] == methods
    assert all(shape["performance_state"] == "SUCCESS" for shape in rows["fast"]["shapes"])
    assert rows["fast"]["shapes_summary"]["shapes"] == 2 and rows["fast"]["speedup"] is not None


def test_the_timing_steps_limit_grows_with_its_timed_shapes():
    timing = {"warmup_ms": 10.0, "budget_ms": 90.0}
    settings = {"correctness": {"timeout_s": 60.0}, "timing": {**timing, "timed": {"shapes": [[8, 16]]}}}
    one = step_limit_s("timing", settings)
    settings["timing"]["timed"]["shapes"] = [[8, 16], [4, 32], [2, 8]]
    assert step_limit_s("timing", settings) - one == pytest.approx(2 * (60.0 + TIMING_BUDGET_FACTOR * 0.1))


def one_shape(state: str, value: float | None = None) -> dict:
    speedup = {"value": value, "ci_low": value * 0.9, "ci_high": value * 1.1, "verdict": "faster"} if value else None
    return {"performance_state": state, "errors": [], "warnings": [], "speedup": speedup, "performance_result": None}


def test_any_inconclusive_shape_leaves_the_summary_inconclusive_and_a_failed_one_fails_the_timing():
    inconclusive = combined([("a", one_shape("SUCCESS", 2.0)), ("b", one_shape("INCONCLUSIVE"))])
    assert inconclusive["performance_state"] == "INCONCLUSIVE"
    assert inconclusive["shapes_summary"]["verdict"] == "inconclusive"
    assert inconclusive["shapes_summary"]["value"] is None
    failed = combined([("a", one_shape("INCONCLUSIVE")), ("b", one_shape("FAILED"))])
    assert failed["performance_state"] == "FAILED"
    conclusive = combined([("a", one_shape("SUCCESS", 2.0)), ("b", one_shape("SUCCESS", 8.0))])
    assert conclusive["speedup"]["value"] == pytest.approx(4.0) and conclusive["speedup"]["verdict"] == "faster"
