"""A re-measured step reaches what reads its result (issue 37, points 2 and 9): a dependent's
key holds the digest of the artifact each dependency produced, so a timing re-run under the
same key (after `magpie clean TASK`, or `magpie build --force TASK`) re-runs its comparison and
the report; `--dry-run` lists tasks in the order they run and says why; `magpie clean` leaves
nothing published from what it removed; a no-op build stays a no-op."""

import json
from pathlib import Path

import pytest
from conftest import build_json, copy_project, magpie

TIMING = "timing:relu2/fast"


def dry_run(root: Path) -> list[dict]:
    return json.loads(magpie("build", "--dry-run", "--json", cwd=root, check=0).stdout)["would_run"]


def stored(root: Path, task: str) -> dict:
    """The result of the task's last build, through the store's index."""
    from urllib.parse import quote

    key = json.loads((root / "workspaces/index" / (quote(task, safe="") + ".json")).read_text())["key"]
    return json.loads((root / "workspaces/store" / key[:2] / key / "result.json").read_text())


def published_median(root: Path, impl: str) -> float:
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    row = next(r for r in report["results"] if r["implementation"] == impl)
    return row["performance_result"]["median_us"]


@pytest.fixture(scope="module")
def timed(timed_pair, tmp_path_factory) -> Path:
    """A copy of the built baseline and honest candidate `fast`, shared by the scenarios below,
    which run in order (each leaves the project built)."""
    return copy_project(timed_pair, tmp_path_factory.mktemp("propagate") / "project")


def test_a_timing_cleaned_and_measured_again_reruns_its_comparison_and_the_report(timed):
    before = stored(timed, TIMING)["performance_result"]["median_us"]
    assert published_median(timed, "fast") == before
    magpie("clean", TIMING, cwd=timed, check=0)
    plan = {row["task"]: row["why"] for row in dry_run(timed)}
    assert list(plan) == [TIMING, "comparison:relu2", "report"]
    assert plan["comparison:relu2"] == f"{TIMING} re-measured first"
    built = build_json(timed)
    assert built["failed"] == [] and built["executed"] == [TIMING, "comparison:relu2", "report"]
    after = stored(timed, TIMING)["performance_result"]["median_us"]
    assert published_median(timed, "fast") == after  # the report shows the new measurement
    assert build_json(timed)["executed"] == []


def test_force_reruns_the_step_and_what_reads_it(timed):
    forced = build_json(timed, "--force", TIMING)
    assert forced["failed"] == [] and forced["executed"] == [TIMING, "comparison:relu2", "report"]
    assert published_median(timed, "fast") == stored(timed, TIMING)["performance_result"]["median_us"]
    assert build_json(timed)["executed"] == []


def test_force_of_the_baselines_timing_retimes_the_candidates_timed_beside_it(timed):
    """A candidate's timing reads the baseline's (the method it chose, what it read alone)."""
    forced = build_json(timed, "--force", "timing:relu2/good")
    assert forced["executed"] == ["timing:relu2/good", TIMING, "comparison:relu2", "report"]


def test_a_step_measured_again_alone_leaves_its_dependents_stale_and_says_why(timed):
    """`magpie build TASK` builds the task and what it depends on; what depends on it is left
    stale, and the next build says which result changed."""
    magpie("clean", TIMING, cwd=timed, check=0)
    assert build_json(timed, TIMING)["executed"] == [TIMING]
    plan = {row["task"]: row["why"] for row in dry_run(timed)}
    assert list(plan) == ["comparison:relu2", "report"]  # the report: cleaned with the timing
    assert plan["comparison:relu2"] == f"{TIMING} was re-measured"
    assert build_json(timed)["executed"] == ["comparison:relu2", "report"]


def test_force_needs_a_target(timed):
    proc = magpie("build", "--force", cwd=timed)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--force" in proc.stderr


def test_dry_run_lists_tasks_in_the_order_they_run(command_project):
    from magpie.project import Project

    rows = dry_run(command_project)
    tasks = Project.load(command_project / "magpie.toml").tasks
    order = [row["task"] for row in rows]
    assert len(order) == len(tasks) == 18
    for position, name in enumerate(order):
        assert all(order.index(dep) < position for dep in tasks[name].deps), name
    assert order.index("compile:k1/base") < order.index("correctness:k1/base") < order.index("comparison:k1")
    assert order[-1] == "report"


def test_clean_leaves_nothing_published_from_what_it_removed(command_project):
    build_json(command_project)
    reports = command_project / "workspaces/reports"
    magpie("clean", "k2", cwd=command_project, check=0)
    assert not (reports / "k2/compare_report.json").exists()
    assert not (reports / "report.html").exists() and not (reports / "summary.md").exists()
    assert (reports / "k1/compare_report.json").is_file()  # k1's verdicts were not removed
    build_json(command_project)
    assert (reports / "k2/compare_report.json").is_file() and (reports / "report.html").is_file()
    magpie("clean", "--all", cwd=command_project, check=0)
    assert not (command_project / "workspaces/graph-snapshot.json").exists()
    assert len(dry_run(command_project)) == 18
