"""The build as a library (execution/build.py, execution/oneshot.py), called in-process as an
MCP server or a Ray driver would: it returns its summary, prints nothing on stdout (its
progress goes where the caller says), raises UserError for bad options, and holds its input
secret itself rather than in this process's environment."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import FIXTURES, relu2_project

from magpie.environment import INPUT_SECRET
from magpie.errors import UserError
from magpie.execution.build import Build, BuildOptions
from magpie.execution.progress import Progress
from magpie.report.models import BuildSummary

TASKS = [
    "compile:relu2/good",
    "compile:relu2/fast",
    "correctness:relu2/good",
    "correctness:relu2/fast",
    "timing:relu2/good",
    "timing:relu2/fast",
    "comparison:relu2",
    "report",
]


class Watched(Progress):
    """Progress into memory that notes, at each line, whether the input secret was in this
    process's environment (the build's jobs run in this process: -j 1)."""

    def __init__(self):
        super().__init__(io.StringIO())
        self.secret_in_environment: list[bool] = []

    def line(self, text: str) -> None:
        self.secret_in_environment.append(INPUT_SECRET in os.environ)
        super().line(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A two-implementation project built once through the API: (root, result, progress, stdout)."""
    assert INPUT_SECRET not in os.environ  # the build draws its own
    root = tmp_path_factory.mktemp("build_api")
    shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
    relu2_project(
        root, ["fast"], "[[8, 16]]", defaults="trials = 1", timing="warmup_ms = 1\nbudget_ms = 10\nrounds = 2"
    )
    progress, stdout = Watched(), io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = Build(BuildOptions(manifest=root / "magpie.toml"), progress).run()
    return root, result, progress, stdout.getvalue()


def test_the_build_returns_its_summary_and_prints_nothing(built):
    _, result, progress, stdout = built
    assert stdout == ""
    assert isinstance(result.summary, BuildSummary)
    assert sorted(result.summary.executed) == sorted(TASKS) and result.summary.failed == []
    assert result.executed == result.summary.executed and result.failures == []
    (kernel,) = result.summary.kernels
    assert kernel.kernel == "relu2" and kernel.compare_report == "workspaces/reports/relu2/compare_report.json"
    assert {impl.implementation: impl.correctness_state for impl in kernel.implementations} == {
        "good": "SUCCESS",
        "fast": "SUCCESS",
    }
    assert result.summary.check.passed and result.exit_code == 0
    assert result.line == "magpie: ran 8 tasks, 0 failed; reports in workspaces/reports"
    lines = progress.stream.getvalue().splitlines()  # the progress went where the caller said
    assert "run   compile:relu2/good  (never built)" in lines
    assert [line for line in lines if line.startswith("done  ")] and not result.up_to_date


def test_the_input_secret_reaches_the_jobs_but_never_the_environment(built):
    root, _, progress, _ = built
    assert progress.secret_in_environment and not any(progress.secret_in_environment)
    assert INPUT_SECRET not in os.environ
    import json

    stored = [json.loads(p.read_text()) for p in (root / "workspaces/store").glob("*/*/result.json")]
    secrets = {r["input_secret"] for r in stored if r.get("task", "").startswith("correctness:")}
    assert len(secrets) == 1 and len(secrets.pop()) == 32  # drawn once for the build, handed to each job


def test_a_second_build_through_the_api_is_up_to_date(built):
    root, _, _, _ = built
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        again = Build(BuildOptions(manifest=root / "magpie.toml")).run()
        plan = Build(BuildOptions(manifest=root / "magpie.toml")).dry_run()
    assert stdout.getvalue() == ""
    assert again.line == "magpie: 8 artifacts up to date" and again.up_to_date and again.exit_code == 0
    assert again.summary.executed == [] and again.summary.up_to_date == 8
    assert [impl.correctness_state for impl in again.summary.kernels[0].implementations] == ["SUCCESS", "SUCCESS"]
    assert plan.would_run == [] and plan.up_to_date == 8


def test_bad_options_raise_one_user_error_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match=r"^--jobs: must be at least 1$"):
        Build(BuildOptions(manifest=tmp_path / "magpie.toml", jobs=0))
    with pytest.raises(UserError, match=r"^--force: name what to run again"):
        Build(BuildOptions(manifest=tmp_path / "magpie.toml", force=True))
    with pytest.raises(UserError, match="magpie.toml: file not found"):
        Build(BuildOptions(manifest=tmp_path / "magpie.toml")).run()


def test_sigterm_before_the_build_starts_is_handled_as_the_caller_had_it(tmp_path):
    """The stop-on-SIGTERM context stops a build that runs; before one runs, the caller's own
    handler gets the signal (the CLI's: the default, which ends the process)."""
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _: received.append(signum))
    try:
        build = Build(BuildOptions(manifest=tmp_path / "magpie.toml"))
        with build.stopped_by_sigterm():
            signal.raise_signal(signal.SIGTERM)
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not build._on_sigterm  # put back as it was
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_analyze_is_a_library_call_returning_its_report(tmp_path, monkeypatch):
    from magpie.execution.oneshot import OneShotOptions, analyze

    for name in ("good", "spec"):
        shutil.copy(FIXTURES / f"adversarial/{name}.py", tmp_path / f"{name}.py")
    monkeypatch.chdir(tmp_path)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        analyzed = analyze(
            OneShotOptions(
                paths=["good.py"],
                type="pytorch",
                entry="kernel",
                spec="spec.py",
                shapes="8x16",
                no_perf=True,
                output_dir=tmp_path / "out",
            )
        )
    assert stdout.getvalue() == ""
    assert analyzed.path == tmp_path / "out/analyze_report.json" and analyzed.path.is_file()
    assert analyzed.report["kernel"] == "good" and analyzed.report["correctness_state"] == "SUCCESS"
    assert analyzed.report["performance_result"] is None  # no_perf: not timed
    assert Path(analyzed.report["source"]).name == "good.py"
