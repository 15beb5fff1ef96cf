"""CI gating and output (issue 37.5, 37.7): `magpie build --check`, verdicts on `done` lines,
one `--json` schema for a build, a no-op and --check, a spec error reported once, reports that
say what was timed and render failure text as text."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, QUICK_TIMING, copy_fixtures, kernel_table, magpie, project_toml, write

from magpie.cli import main
from magpie.cli.compare import table
from magpie.harness.kinds import failure, failure_kind
from magpie.report import verdicts
from magpie.report.models import BuildSummary
from magpie.report.render import render


def _built(root: Path, *args) -> tuple:
    proc = magpie("build", "-j", "2", "--json", "--check", *args, cwd=root)
    return proc, json.loads(proc.stdout)


def _noop(root: Path, capsys, *args) -> tuple[int, str]:
    """The CLI in-process: a no-op reads the snapshot and the stored verdicts only."""
    capsys.readouterr()
    code = main(["build", "-m", str(root / "magpie.toml"), *args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """relu2: the baseline, a NaN candidate (fails correctness) and a copy of the baseline
    declared expect_faster (correct, not faster): one build with --json --check."""
    root = tmp_path_factory.mktemp("mixed")
    shutil.copy(FIXTURES / "adversarial" / "good.py", root / "twin.py")
    copy_fixtures(root, ["good", "nan", "spec"])
    relu2 = kernel_table(
        "relu2", "good", ["nan", "twin"], shapes="[[64, 64]]", candidate_settings={"twin": "expect_faster = true"}
    )
    (root / "magpie.toml").write_text(project_toml(relu2, timing=QUICK_TIMING))
    proc, summary = _built(root)
    return root, proc, summary


def _impl(summary: dict, name: str) -> dict:
    (kernel,) = summary["kernels"]
    return next(row for row in kernel["implementations"] if row["implementation"] == name)


def test_check_fails_on_a_failed_candidate_and_an_unmet_expect_faster(mixed):
    _, proc, summary = mixed
    assert proc.returncode == 1, proc.stderr
    BuildSummary.model_validate(summary)
    assert summary["failed"] == [] and not summary["check"]["passed"]
    assert _impl(summary, "good")["outcome"] == "passed" and _impl(summary, "good")["check"] is None
    nan = _impl(summary, "nan")
    assert nan["outcome"] == "failed" and nan["correctness_state"] == "FAILED"
    assert "finite" in [f["kind"] for f in nan["failures"]]
    twin = _impl(summary, "twin")
    assert twin["outcome"] == "passed" and twin["expect_faster"]
    assert twin["check"].startswith("expected faster, measured ") and twin["speedup"]["verdict"] != "faster"
    problems = summary["check"]["problems"]
    assert len(problems) == 2 and problems[0].startswith("relu2/nan: failed: ")
    assert summary["kernels"][0]["compare_report"] == "workspaces/reports/relu2/compare_report.json"
    assert summary["reports"] == {"html": "workspaces/reports/report.html", "summary": "workspaces/reports/summary.md"}


def test_done_lines_carry_the_verdict(mixed):
    _, proc, summary = mixed
    lines = proc.stderr.splitlines()
    assert any(line.startswith("done  correctness:relu2/nan  FAILED finite  ") for line in lines), proc.stderr
    assert any(line.startswith("done  correctness:relu2/twin  correct  ") for line in lines), proc.stderr
    speedup = _impl(summary, "twin")["speedup"]
    said = f"correct · {speedup['value']:.3g}× {speedup['verdict']} [{speedup['ci_low']:.3g}, {speedup['ci_high']:.3g}]"
    assert any(line.startswith(f"done  timing:relu2/twin  {said} · ") for line in lines), proc.stderr
    assert any(line.startswith("done  comparison:relu2  2 of 3 passed; failed: nan") for line in lines), proc.stderr


def test_a_noop_gives_the_same_summary_and_check(mixed, capsys):
    root, _, summary = mixed
    code, out = _noop(root, capsys, "--json", "--check")
    again = json.loads(out)
    assert code == 1 and again["executed"] == [] and again["up_to_date"] >= 10
    assert again["kernels"] == summary["kernels"] and again["check"] == summary["check"]
    code, out = _noop(root, capsys, "--json")  # without --check: today's exit code, the same schema
    assert code == 0 and json.loads(out)["kernels"] == summary["kernels"]
    code, out = _noop(root, capsys, "--check")
    assert code == 1 and "check: relu2/nan: failed: " in out and "magpie: check failed: 2 problem(s)" in out
    code, out = _noop(root, capsys)
    assert code == 0 and out.strip().endswith("artifacts up to date")


def test_a_build_of_some_tasks_is_checked_on_their_results(mixed, capsys):
    """Task names whose kernel's comparison the build does not cover: their stored results
    are judged as the comparison would judge them (the full load's path, not the snapshot's)."""
    root, _, summary = mixed
    code, out = _noop(root, capsys, "correctness:relu2/nan", "--json", "--check")
    (kernel,) = json.loads(out)["kernels"]
    assert code == 1 and kernel["compare_report"] is None
    assert [(r["implementation"], r["outcome"]) for r in kernel["implementations"]] == [("nan", "failed")]
    code, out = _noop(root, capsys, "timing:relu2/good", "--json", "--check")
    assert code == 0 and json.loads(out)["check"] == {"passed": True, "problems": []}
    code, out = _noop(root, capsys, "relu2", "--json", "--check")  # a kernel id: its comparison
    assert code == 1 and json.loads(out)["kernels"] == summary["kernels"]


def test_timeouts_and_inconclusive_timings_fail_the_check():
    timeout = "timeout after 10 s"
    timed_out = {
        "implementation": "x",
        "compiling_state": "SUCCESS",
        "correctness_state": "FAILED",
        "performance_state": "SKIPPED",
        "errors": [timeout],
        "failures": [failure(failure_kind(timeout), "correctness", timeout)],
    }
    busy = "inconclusive: machine busy: its threads waited for a CPU 60% of the time"
    inconclusive = {
        "implementation": "y",
        "compiling_state": "SUCCESS",
        "correctness_state": "SUCCESS",
        "performance_state": "INCONCLUSIVE",
        "errors": [busy],
        "failures": [],
    }
    assert verdicts.outcome(timed_out) == "timed_out" and verdicts.outcome(inconclusive) == "inconclusive"
    assert verdicts.implementation_summary(timed_out, False)["check"] == "timed out: timeout after 10 s"
    assert verdicts.implementation_summary(inconclusive, False)["check"] == busy
    assert verdicts.task_line("timing", inconclusive) == busy


def test_the_report_says_what_was_timed_and_against_which_baseline_median(mixed):
    root, _, summary = mixed
    compare = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    assert compare["timed_shapes"] == ["[64, 64] float32"]
    against = f"vs baseline {_impl(summary, 'twin')['speedup']['baseline_median_us']:,.2f} µs"
    for name in ("summary.md", "report.html"):
        text = (root / "workspaces/reports" / name).read_text()
        assert "timed on [64, 64] float32" in text.lower() and against in text, name
    text = table(compare)  # what `magpie compare` prints
    assert against in next(line for line in text.splitlines() if line.startswith("twin "))
    assert "timed on [64, 64] float32" in text


SPEC_ERROR_PROJECT = {
    "magpie.toml": project_toml(
        kernel_table("relu2", "good", ["twin"], spec="specs/relu_spec.py", shapes="[[8, 8]]"), name="broken"
    ),
    "specs/relu_spec.py": """
        import torch


        def make_inputs(shape, dtype, generator):
            raise ValueError("the spec's own bug")


        def reference(x):
            return torch.relu(x) * 2.0
        """,
}


@pytest.fixture(scope="module")
def spec_error(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_error")
    write(root, SPEC_ERROR_PROJECT)
    for name in ("good.py", "twin.py"):
        shutil.copy(FIXTURES / "adversarial" / "good.py", root / name)
    proc, summary = _built(root)
    return root, proc, summary


def test_a_spec_error_is_one_error_naming_the_spec_and_its_implementations_are_not_judged(spec_error):
    root, proc, summary = spec_error
    assert proc.returncode == 1 and summary["failed"] == []
    compare = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    (error,) = compare["spec_errors"]
    assert error["spec"] == "specs/relu_spec.py" and "make_inputs() failed" in error["detail"]
    assert compare["errors"] == [f"spec error in specs/relu_spec.py: {error['detail']}"]
    assert {r["correctness_state"] for r in compare["results"]} == {"SKIPPED"}
    assert {r["outcome"] for r in summary["kernels"][0]["implementations"]} == {"not_judged"}
    (problem,) = summary["check"]["problems"]
    assert problem.startswith("relu2: spec error in specs/relu_spec.py: make_inputs() failed")
    assert "done  correctness:relu2/twin  not judged: spec error in specs/relu_spec.py" in proc.stderr


def test_check_passes_where_every_implementation_passed(command_project, capsys):
    proc = magpie("build", "--check", cwd=command_project)
    assert proc.returncode == 0 and "magpie: check passed" in proc.stdout, proc.stdout + proc.stderr
    assert "done  correctness:k1/a  correct (checked by the testcase command)" in proc.stderr
    assert _noop(command_project, capsys, "--check")[0] == 0


def test_failure_text_is_rendered_as_text():
    """A failure message (code under test's words) with Markdown emphasis or HTML stays text."""
    hostile = "error: **owned** <img src=x onerror=alert(1)> | [link](http://x) _it_"
    row = {
        "implementation": "evil",
        "is_baseline": False,
        "compiling_state": "SUCCESS",
        "correctness_state": "FAILED",
        "numerics": "verified",
        "verdict": hostile,
        "performance_state": "SKIPPED",
        "performance_result": None,
        "baseline_result": None,
        "samples_us": None,
        "speedup": None,
        "profile": None,
        "errors": [hostile],
        "warnings": [],
        "failures": [],
        "flags": [],
    }
    comparison = {
        "kernel": "k",
        "baseline": None,
        "ranking": [],
        "best": None,
        "results": [row],
        "errors": [],
        "excluded": [{"implementation": "evil", "reason": f"correctness FAILED: {hostile}"}],
    }
    pages = render([comparison], "p")
    markdown, html = pages["summary.md"], pages["report.html"]
    assert "**owned**" not in markdown and "\\*\\*owned\\*\\*" in markdown
    assert "<img" not in markdown and "&lt;img" in markdown and "[link]" not in markdown
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
