"""An inconclusive timing is not final (issue 37 point 1): the build that measured it stores it
(its comparison and report show "inconclusive: machine busy"), marked provisional in the
artifact, and the next build measures it again, with what reads it; a build after a conclusive
measurement is a no-op. The fast no-op path declines while a provisional result is stored.

The timing's verdict is made inconclusive by the harness's own `judging.inconclusive` on a real stored
measurement (a busy machine cannot be ordered up in a test); the action that marks it, the store,
the staleness and the builds are the real ones, run in-process (`magpie.cli.main`)."""

import contextlib
import copy
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import copy_project, magpie

from magpie.cli import main
from magpie.execution import actions
from magpie.execution.build import up_to_date_by_snapshot
from magpie.graph import snapshot
from magpie.project import Project

TIMING = "timing:relu2/fast"
DEPENDENTS = ["comparison:relu2", "report"]


def stored_result(root: Path, task: str) -> dict:
    project = Project.load(root / "magpie.toml")
    return project.store.read(project.tasks[task].key)


def provisional(root: Path, task: str) -> str | None:
    project = Project.load(root / "magpie.toml")
    return project.store.provisional(project.tasks[task].key)


def published_row(root: Path, impl: str) -> dict:
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    return next(row for row in report["results"] if row["implementation"] == impl)


def inconclusive(measured: dict) -> dict:
    """A stored timing result as the harness leaves one a busy machine disturbed in every measurement."""
    from magpie.harness import judging

    result = copy.deepcopy(measured)
    label = result["performance_result"]["shape"]  # e.g. "[8, 16] float32"
    shape, dtype = label.rsplit(" ", 1)
    case = SimpleNamespace(label=label, shape=json.loads(shape), dtype=dtype)
    result["errors"] = ["a call read 0.001 us, under 0.25 of what copying its outputs costs"]
    judging.inconclusive(result, ["candidate: its calls read under their copy"], [0.61, 0.58, 0.64], case, 0)
    return result


def build_in_process(root: Path, timing_result: dict, *args: str) -> dict:
    """`magpie build --json ARGS` in this process, its timing jobs answered with `timing_result`
    where an evaluator would measure (the -j 1 build runs its actions here)."""
    real = actions._evaluate

    def evaluate(mode, job, out_dir, *rest, **named):
        return copy.deepcopy(timing_result) if mode == "timing" else real(mode, job, out_dir, *rest, **named)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(actions, "_evaluate", evaluate)
        code = main(["build", "-m", str(root / "magpie.toml"), "--json", *args])
    summary = json.loads(out.getvalue())
    assert code == 0 and summary["failed"] == [], summary
    return summary


def dry_run(root: Path) -> dict[str, str]:
    rows = json.loads(magpie("build", "--dry-run", "--json", cwd=root, check=0).stdout)["would_run"]
    return {row["task"]: row["why"] for row in rows}


@pytest.fixture(scope="module")
def measured(timed_pair, tmp_path_factory) -> tuple[Path, dict]:
    """A copy of the baseline and one honest candidate built and timed; then the candidate's timing
    measured again and found inconclusive, with its comparison and report: the scenarios below
    run in order on this project."""
    root = copy_project(timed_pair, tmp_path_factory.mktemp("provisional") / "project")
    conclusive = stored_result(root, TIMING)
    assert conclusive["performance_state"] == "SUCCESS"
    built = build_in_process(root, inconclusive(conclusive), "--force", TIMING)
    assert built["executed"] == [TIMING, *DEPENDENTS]
    return root, conclusive


def test_the_build_that_measured_it_stores_and_shows_it_marked_not_final(measured):
    root, _ = measured
    assert stored_result(root, TIMING)["performance_state"] == "INCONCLUSIVE"
    assert provisional(root, TIMING) == actions.PROVISIONAL_INCONCLUSIVE
    row = published_row(root, "fast")
    assert row["performance_state"] == "INCONCLUSIVE"
    assert any(error.startswith("inconclusive: machine busy") for error in row["errors"])
    assert provisional(root, "comparison:relu2") is None  # only the timing is marked


def test_the_next_build_measures_it_again_with_what_reads_it_then_is_a_no_op(measured):
    root, conclusive = measured
    manifest = root / "magpie.toml"
    assert snapshot.load_fresh(manifest) is not None  # the snapshot holds (written by this process's build)
    with contextlib.redirect_stdout(io.StringIO()):
        assert up_to_date_by_snapshot(manifest) is None  # the fast path declines
    plan = dry_run(root)
    assert list(plan) == [TIMING, *DEPENDENTS]
    assert plan[TIMING] == f"was {actions.PROVISIONAL_INCONCLUSIVE}: measured again"
    assert plan["comparison:relu2"] == f"{TIMING} re-measured first"
    assert Project.load(manifest).stale() == [TIMING, *DEPENDENTS]

    again = build_in_process(root, conclusive)  # measured again, conclusive this time
    assert again["executed"] == [TIMING, *DEPENDENTS]
    assert provisional(root, TIMING) is None
    assert published_row(root, "fast")["performance_state"] == "SUCCESS"

    assert Project.load(manifest).stale() == []
    assert build_in_process(root, conclusive)["executed"] == []
    fast = up_to_date_by_snapshot(manifest)  # the fast path's no-op again
    assert fast is not None and fast.exit_code == 0 and "up to date" in fast.line


def test_a_provisional_marker_removed_is_a_modified_artifact(tmp_path):
    """The marker is among the artifact's signed digests: removing it (to pass an inconclusive
    result off as final) is found and the artifact rebuilt."""
    from magpie.store import PROVISIONAL, Store

    store = Store(tmp_path)
    store.commit(
        "ab" * 32, {"performance_state": "INCONCLUSIVE", "provisional": "inconclusive (machine busy)"}, {}, task=TIMING
    )
    assert store.provisional("ab" * 32) == "inconclusive (machine busy)"
    (store.path("ab" * 32) / PROVISIONAL).unlink()
    assert store.check("ab" * 32, TIMING) == f"{PROVISIONAL} missing"
