"""Bounded profiles (issue 13): ncu's launch cap, a metric set sized to the roofline, a timeout
derived from the implementation's measured time, profiles after every timing, a failed profile
as a warning on its row, "no kernel ran" for a range without kernels, and command-only kernels
profiled as labelled profiler time. The GPU tests at the end run on the H200 (`pytest -m gpu`)."""

import ast
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FIXTURES, build_json, write

from magpie.execution import profile as profile_action
from magpie.execution.actions import comparison
from magpie.execution.doit_glue import closure, doit_fields
from magpie.harness.judging import correctness_verdict
from magpie.manifest.models import ProfileSettings
from magpie.project import Project
from magpie.report.models import CompareReport
from magpie.report.render import markdown_text, render
from magpie.roofline.ncu import (
    BASIC,
    KERNEL_ID,
    PER_LAUNCH_CONFIG,
    NcuParseError,
    invocations,
    kernel_roofline,
    metrics,
    ncu_command,
    parse_raw_csv,
    profiled_nothing,
)
from magpie.roofline.specs import lookup

NCU = FIXTURES / "ncu"
H200 = FIXTURES / "h200"
BOUNDS = ProfileSettings().model_dump()


# -- the ncu command line ------------------------------------------------------------------


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_ncu_command_caps_launches_per_kernel_and_in_all():
    argv = ncu_command(metrics(), 3, 48, KERNEL_ID, nvtx_range="magpie_profile")
    assert _option(argv, "--kernel-id") == ":::^(1|2|3)$"  # any context, stream and kernel; invocations 1-3
    assert _option(argv, "--launch-count") == "48"
    assert _option(argv, "--metrics").split(",") == metrics()
    assert _option(argv, "--profile-from-start") == "off"  # the range's cudaProfilerStart starts the count
    assert _option(argv, "--nvtx-include") == "magpie_profile/" and "--nvtx" in argv
    assert "--filter-mode" not in argv
    # the implementation's process alone: one its code left would hold ncu until the timeout
    assert _option(argv, "--target-processes") == "application-only"


def test_the_invocation_regex_takes_the_first_n_whole_numbers_only():
    for n in (1, 3, 12):
        pattern = invocations(n)
        assert [i for i in range(1, 200) if re.fullmatch(pattern, str(i))] == list(range(1, n + 1))
        assert ":" not in pattern  # the kernel-id's field separator


def test_the_fallback_caps_per_launch_configuration():
    argv = ncu_command(list(BASIC), 2, 48, PER_LAUNCH_CONFIG)
    assert _option(argv, "--filter-mode") == "per-launch-config" and _option(argv, "--launch-count") == "2"
    assert "--kernel-id" not in argv
    assert "--nvtx" not in argv and "--profile-from-start" not in argv  # a command: every kernel it launches
    assert _option(argv, "--target-processes") == "all"  # in every process it starts


def test_the_metric_set_is_what_the_roofline_uses():
    """Every counter asked for changes a kernel's row (its duration, bytes or FLOPs); the
    speed-of-light throughputs, shown nowhere, are gone."""
    names = metrics()
    assert not [n for n in names if "pct_of_peak" in n or "throughput" in n]
    arch = lookup("NVIDIA H200")
    base = {"name": "k", "metrics": {n: 1.0 for n in names}}
    plain = kernel_roofline(base, arch)
    for name in names:
        bumped = kernel_roofline({"name": "k", "metrics": {**base["metrics"], name: 1e6}}, arch)
        assert bumped != plain, f"{name} is asked for but changes nothing in the row"


# -- "no kernel ran" -------------------------------------------------------------------------


def test_an_ncu_run_that_profiled_nothing_is_told_from_a_failure():
    stdout, stderr = (NCU / "no_kernels.stdout").read_text(), (NCU / "no_kernels.stderr").read_text()
    with pytest.raises(NcuParseError):
        parse_raw_csv(stdout)  # no ID rows: not a table at all
    assert profiled_nothing(stdout, stderr)
    assert profiled_nothing("", "==WARNING== No kernels were profiled.\n")
    assert not profiled_nothing("", "==ERROR== Failed to find metric sm__foo.sum\n")
    assert not profiled_nothing((H200 / "ncu_softmax_cuda.csv").read_text(), "")


# -- the timeout -----------------------------------------------------------------------------


def test_the_timeout_grows_with_the_measured_time_between_a_floor_and_a_ceiling():
    few, basis = profile_action.profile_timeout(BOUNDS, call_s=5e-6, launches=4)
    assert few == profile_action.FLOOR_S and basis["launches"] == 4 and basis["call_s"] == 5e-6
    fast, _ = profile_action.profile_timeout(BOUNDS, call_s=5e-6, launches=48)
    assert fast == pytest.approx(profile_action.STARTUP_S + 48 * profile_action.PER_LAUNCH_S, abs=0.2)
    slow, basis = profile_action.profile_timeout(BOUNDS, call_s=0.023, launches=48, first_call_s=4.0)
    reckoned = (
        profile_action.STARTUP_S
        + profile_action.FIRST_CALL_FACTOR * 4.0
        + profile_action.CALLS * 0.023
        + 48 * (profile_action.PER_LAUNCH_S + profile_action.REPLAY_PASSES * 0.023)
    )
    assert slow == pytest.approx(round(reckoned, 1)) and basis["reckoned_s"] == pytest.approx(reckoned, abs=0.1)
    assert fast < slow < BOUNDS["max_timeout_s"]
    huge, _ = profile_action.profile_timeout(BOUNDS, call_s=2.0, launches=48)
    assert huge == BOUNDS["max_timeout_s"] == 600


# -- the profile action, with a stand-in ncu ---------------------------------------------------

FAKE_NCU = """\
#!{python}
import os, sys, time
argv = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as log:
    log.write(repr(argv) + "\\n")
mode = os.environ["FAKE_NCU_MODE"]
if mode == "sleep":
    time.sleep(30)
kernel_id = "--kernel-id" in argv
if mode == "nothing" or (mode == "nothing_by_kernel_id" and kernel_id):
    print("==PROF== Connected to process 1 (python)")
    print("==PROF== No kernels were profiled.", file=sys.stderr)
    sys.exit(0)
sys.stdout.write(open(os.environ["FAKE_NCU_CSV"]).read())
"""


def fake_job(
    tmp_path: Path, *, testcases: list[dict], median_us: float | None = 20.0, kernels=None, checks=None, bounds=None
) -> SimpleNamespace:
    (tmp_path / "impl.py").write_text("def kernel(x):\n    return x\n")
    settings = {
        "correctness": {"testcases": testcases, "seed": 0, "timeout_s": 60, "memory_mb": 8192},
        "profile": {**BOUNDS, **(bounds or {})},
        "project": {"device": "cuda"},
    }
    impl = {
        "id": "cand",
        "type": "pytorch",
        "source": "impl.py",
        "source_files": [],
        "entry": "kernel",
        "working_dir": None,
        "env": {},
        "is_baseline": False,
    }
    perf = None if median_us is None else {"median_us": median_us, "kernels": kernels}
    spec = SimpleNamespace(
        kernel="k", impl="cand", rule="profile", params={"root": str(tmp_path), "impl": impl, "settings": settings}
    )
    return SimpleNamespace(
        spec=spec,
        dep_dirs={},
        dep_results={
            "correctness:k/cand": {
                "correctness_state": "SUCCESS",
                "checks": checks or [],
                "worker_steps_s": [{"first_call": 2.0}],
            },
            "timing:k/cand": {"performance_state": "SUCCESS" if perf else "SKIPPED", "performance_result": perf},
        },
    )


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "ncu"
    script.write_text(FAKE_NCU.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "ncu-calls.log"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setenv("FAKE_NCU_CSV", str(H200 / "ncu_softmax_cuda.csv"))
    monkeypatch.setenv("MAGPIE_TRUST_CODE", "1")  # no sandbox around the stand-in
    return lambda: [ast.literal_eval(line) for line in log.read_text().splitlines()] if log.exists() else []


SPEC = [{"spec": "spec.py", "shapes": [[4, 4]], "dtypes": ["float32"], "rtol": 1e-5, "atol": 1e-6, "trials": 1}]


def test_a_profile_runs_ncu_with_the_cap_the_metrics_and_a_derived_timeout(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "csv")
    job = fake_job(tmp_path, testcases=SPEC, median_us=23_000.0, kernels={"add": 10.0})
    out = tmp_path / "out"
    out.mkdir()
    result = profile_action.profile(job, out)
    assert result["state"] == "SUCCESS", result["errors"]
    [argv] = fake_ncu()
    assert _option(argv, "--kernel-id") == ":::^(1|2|3)$" and _option(argv, "--launch-count") == "48"
    assert _option(argv, "--metrics").split(",") == metrics()
    assert argv[-3:-1] == ["-m", "magpie.harness.profile"]  # the profiled process, after ncu's options
    assert result["launch_cap"] == {"per_kernel": 3, "total": 48, "filter": KERNEL_ID}
    expected, _ = profile_action.profile_timeout(BOUNDS, call_s=0.023, launches=48, first_call_s=2.0)
    assert result["timeout_s"] == expected and result["timeout_basis"]["median_us"] == 23_000.0
    assert len(result["kernels"]) == 1 and result["kernels"][0]["duration_us"] > 0
    assert (out / "ncu.csv").read_text().startswith("==WARNING==")
    [attempt] = result["attempts"]  # how long ncu took, in seconds (an interpreter's start at least)
    assert attempt["outcome"] == "profiled" and 0.005 < attempt["wall_s"] < 15


def test_a_profile_that_times_out_fails_after_the_derived_timeout(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "sleep")
    job = fake_job(tmp_path, testcases=SPEC, bounds={"max_timeout_s": 1.0})
    started = time.monotonic()
    result = profile_action.profile(job, tmp_path)
    assert time.monotonic() - started < 15
    assert result["state"] == "FAILED" and result["timeout_s"] == 1.0
    assert result["errors"][0].startswith("ncu timeout after 1 s")


def test_a_range_without_kernels_is_no_kernel_ran_not_a_parser_failure(tmp_path, fake_ncu, monkeypatch):
    """x.clone() is a device-to-device memcpy: its timing saw only a copy, ncu profiles nothing."""
    monkeypatch.setenv("FAKE_NCU_MODE", "nothing")
    job = fake_job(tmp_path, testcases=SPEC, kernels={"Memcpy DtoD (Device -> Device)": 3.0})
    result = profile_action.profile(job, tmp_path)
    assert result["state"] == "SUCCESS" and result["kernels"] == [] and result["total_duration_us"] == 0
    assert any("no kernel ran in the profiled range" in note for note in result["notes"])
    assert len(fake_ncu()) == 1  # nothing expected, nothing tried again


def test_kernel_id_profiling_nothing_where_the_timing_saw_kernels_falls_back(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "nothing_by_kernel_id")
    job = fake_job(tmp_path, testcases=SPEC, kernels={"vectorized_elementwise_kernel": 3.0})
    result = profile_action.profile(job, tmp_path)
    first, second = fake_ncu()
    assert "--kernel-id" in first and _option(second, "--filter-mode") == "per-launch-config"
    assert result["state"] == "SUCCESS" and len(result["kernels"]) == 1
    assert result["launch_cap"] == {"per_kernel": 3, "total": None, "filter": PER_LAUNCH_CONFIG}
    assert [a["outcome"] for a in result["attempts"]] == ["nothing profiled", "profiled"]


def test_a_profile_never_fails_its_task(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "csv")
    job = fake_job(tmp_path, testcases=SPEC)
    del job.spec.params["root"]  # anything going wrong inside
    result = profile_action.profile(job, tmp_path)
    assert result["state"] == "FAILED" and result["errors"][0].startswith("profile: KeyError")


def test_a_command_only_kernel_profiles_its_command_as_profiler_time(tmp_path, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "csv")
    testcases = [{"command": "python check.py", "env": {"CHECK": "1"}}]
    checks = [{"testcase": 0, "case": "command", "trial": 0, "passed": True, "wall_s": 7.5}]
    job = fake_job(tmp_path, testcases=testcases, median_us=None, checks=checks)
    result = profile_action.profile(job, tmp_path)
    [argv] = fake_ncu()
    assert argv[-3:] == ["/bin/sh", "-c", "python check.py"]
    assert "--nvtx" not in argv and _option(argv, "--kernel-id") == ":::^(1|2|3)$"
    assert result["state"] == "SUCCESS" and result["command"] == "python check.py" and result["testcase"] == 0
    timed = result["profiler_time"]
    assert timed["method"] == profile_action.PROFILER_TIME_METHOD and "profiler time" in timed["method"]
    assert timed["kernel_us"] == pytest.approx(75.296) and timed["launches"] == 1
    assert result["timeout_basis"]["command_wall_s"] == 7.5
    assert (
        result["timeout_s"]
        == profile_action.profile_timeout(BOUNDS, call_s=profile_action.COMMAND_LAUNCH_S, launches=48, fixed_s=22.5)[0]
    )


# -- the graph: profiles after every timing, keyed only by their own -----------------------


@pytest.fixture
def gpu_graph(command_project) -> Path:
    """The command project on a GPU device (its graph only: nothing is built)."""
    manifest = command_project / "magpie.toml"
    manifest.write_text(
        manifest.read_text().replace(
            'name = "cmd"\n', 'name = "cmd"\ndevice = "cuda"\n\n[defaults.profile]\nlaunches_per_kernel = 2\n', 1
        )
    )
    return command_project


def test_profiles_run_after_every_timing_and_no_timing_waits_on_a_profile(gpu_graph):
    project = Project.load(gpu_graph / "magpie.toml")
    tasks = project.tasks
    timings = {n for n in tasks if n.startswith("timing:")}
    profiles = {n for n in tasks if n.startswith("profile:")}
    assert len(timings) == len(profiles) == 5
    fields = {f["name"]: f for f in doit_fields(project, None)}
    for name in profiles:
        assert set(fields[name]["task_dep"]) >= timings  # waits for every timing of the project
        assert f"timing:{name.split(':', 1)[1]}" in tasks[name].deps  # reads its own
        assert tasks[name].config["profile"]["launches_per_kernel"] == 2
    for name in timings:  # nothing a timing waits for, however far up, is a profile
        stack, seen = [name], set()
        while stack:
            for dep in fields[stack.pop()]["task_dep"]:
                assert not dep.startswith("profile:"), (name, dep)
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)


def test_another_implementations_timing_is_order_only(gpu_graph):
    """A profile's key holds its own timing's, not the others': editing one candidate does not
    re-profile the rest of the project, and building one kernel does not time the others."""
    before = Project.load(gpu_graph / "magpie.toml").tasks
    (gpu_graph / "k2/c.py").write_text("def kernel(x):\n    return x - 0.0\n")
    after = Project.load(gpu_graph / "magpie.toml").tasks
    assert before["timing:k2/c"].key != after["timing:k2/c"].key
    assert before["profile:k2/c"].key != after["profile:k2/c"].key
    for name in ("profile:k1/base", "profile:k1/a", "profile:k1/b", "profile:k2/base"):
        assert before[name].key == after[name].key, name
    project = Project.load(gpu_graph / "magpie.toml")
    selected = project.select(["k1"])
    within = set(closure(project, selected))
    fields = {f["name"]: f for f in doit_fields(project, None, within)}
    assert not [d for d in fields["profile:k1/a"]["task_dep"] if ":k2/" in d]


def test_a_rule_may_not_wait_for_an_unknown_rule(tmp_path):
    from magpie.errors import UserError
    from magpie.graph.rules import resolve_rules

    with pytest.raises(UserError, match=r"after.*no rule named 'nope'"):
        resolve_rules([{"name": "profile", "after": ["all.nope"]}], tmp_path / "magpie.toml")


# -- the comparison: a failed profile is a warning ------------------------------------------


def _perf(median: float) -> dict:
    return {
        "median_us": median,
        "p20_us": median,
        "p80_us": median,
        "min_us": median,
        "mean_us": median,
        "n": 50,
        "cv": 0.01,
        "method": "CUDA events",
    }


def _comparison_job(profile_of_a: dict) -> SimpleNamespace:
    speedup = {"value": 2.0, "ci_low": 1.9, "ci_high": 2.1, "verdict": "faster"}
    results = {}
    for impl, median in (("base", 20.0), ("a", 10.0)):
        results[f"compile:k/{impl}"] = {"compiling_state": "SUCCESS", "errors": []}
        results[f"correctness:k/{impl}"] = {
            "correctness_state": "SUCCESS",
            "numerics": "verified",
            "verdict": "correct",
            "errors": [],
        }
        results[f"timing:k/{impl}"] = {
            "performance_state": "SUCCESS",
            "performance_result": _perf(median),
            "errors": [],
            "warnings": [],
            "speedup": speedup if impl == "a" else None,
        }
    results["profile:k/base"] = {"state": "SUCCESS", "kernels": [], "errors": []}
    results["profile:k/a"] = profile_of_a
    spec = SimpleNamespace(kernel="k", params={"baseline": {"id": "base"}})
    return SimpleNamespace(spec=spec, dep_results=results)


def test_a_failed_profile_is_a_warning_and_changes_no_ranking(tmp_path):
    good = comparison(_comparison_job({"state": "SUCCESS", "kernels": [], "errors": []}), tmp_path)
    failed = comparison(
        _comparison_job({"state": "FAILED", "kernels": [], "errors": ["ncu timeout after 132 s"]}), tmp_path
    )
    CompareReport.model_validate(failed)
    assert failed["ranking"] == good["ranking"] == ["a", "base"] and failed["best"] == good["best"] == "a"
    assert failed["excluded"] == good["excluded"] == []
    row = next(r for r in failed["results"] if r["implementation"] == "a")
    assert row["warnings"] == ["profile failed, no counters or roofline: ncu timeout after 132 s"]
    assert row["speedup"]["verdict"] == "faster" and row["performance_state"] == "SUCCESS"
    pages = render([failed], "p")
    assert "profile failed, no counters or roofline (ncu timeout after 132 s)" in pages["summary.md"]
    assert 'class="FAILED">warning</span>' in pages["report.html"]


def test_a_command_only_kernels_profiler_time_reaches_the_row_and_the_report(tmp_path):
    job = _comparison_job(
        {
            "state": "SUCCESS",
            "kernels": [],
            "errors": [],
            "profiler_time": {
                "method": profile_action.PROFILER_TIME_METHOD,
                "kernel_us": 42.5,
                "launches": 3,
                "kernels": ["k"],
            },
        }
    )
    report = comparison(job, tmp_path)
    CompareReport.model_validate(report)
    row = next(r for r in report["results"] if r["implementation"] == "a")
    assert row["profiler_time"]["kernel_us"] == 42.5
    summary = render([report], "p")["summary.md"]
    # the method as Markdown shows it as written (its underscores escaped)
    assert (
        markdown_text(f"42.50 µs of kernel time over 3 profiled launch(es): {profile_action.PROFILER_TIME_METHOD}")
        in summary
    )


# -- the numerics of a kernel judged by commands ---------------------------------------------


def test_numerics_checked_by_the_testcase_command():
    command = {"testcase": 0, "case": "command", "trial": 0, "passed": True, "check": "exit code", "detail": ""}
    compared = {
        "testcase": 1,
        "case": "4x4",
        "trial": 0,
        "passed": True,
        "check": "allclose",
        "detail": "",
        "max_abs_err": 0.0,
        "max_rel_err": 0.0,
        "rel_err_norm": 0.0,
    }
    judged = correctness_verdict([command], "verified")
    assert judged["numerics"] == "checked by the testcase command" and judged["verdict"] == "correct"
    assert correctness_verdict([command, compared], "verified")["numerics"] == "verified"
    assert correctness_verdict([compared], "unverified")["numerics"] == "unverified"
    failed = correctness_verdict(
        [{**command, "passed": False, "detail": "exit 1", "kind": "testcase_command"}], "verified"
    )
    assert failed["correctness_state"] == "FAILED" and failed["numerics"] == "checked by the testcase command"


def test_a_command_project_reports_its_numerics_as_checked_by_the_command(command_project):
    assert build_json(command_project, "k2")["failed"] == []
    report = json.loads((command_project / "workspaces/reports/k2/compare_report.json").read_text())
    assert {r["numerics"] for r in report["results"]} == {"checked by the testcase command"}
    assert all(r["verdict"] == "correct" for r in report["results"])


# -- on the H200 ---------------------------------------------------------------------------------

LOOP = """\
def kernel(x):
    y = x
    for _ in range(900):  # 1,800 launches of two tiny elementwise kernels per call
        y = y + 0.0
        y = y * 1.0
    return y
"""
CHECK = """\
import importlib.util, os, sys
import torch
spec = importlib.util.spec_from_file_location("impl", os.environ["MAGPIE_IMPL_SOURCE"])
impl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(impl)
x = torch.randn(1 << 20, device="cuda")
sys.exit(0 if torch.allclose(impl.kernel(x), torch.relu(x) * 2.0) else 1)
"""


@pytest.fixture(scope="module")
def gpu_profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    write(
        root,
        {
            "loop.py": LOOP,
            "clone.py": "def kernel(x):\n    return x.clone()\n",
            "relu2.py": "import torch\n\n\ndef kernel(x):\n    return torch.relu(x) * 2.0\n",
            "spec.py": textwrap.dedent("""\
                     import torch


                     def make_inputs(shape, dtype, generator):
                         return (torch.randn(shape, generator=generator, dtype=dtype),)


                     def reference(x):
                         return x.clone()
                     """),
            "check.py": CHECK,
        },
    )
    (root / "magpie.toml").write_text(f"""[project]
name = "profiles"
device = "cuda"

[defaults]
timeout_s = 120

[defaults.timing]
warmup_ms = 5
budget_ms = 60
rounds = 3

[[kernel]]
id = "loop"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "clone"
source = "clone.py"

[[kernel.candidates]]
id = "many"
source = "loop.py"

[[kernel.testcases]]
spec = "spec.py"
shapes = [[256, 1024]]

[[kernel]]
id = "cmd"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "relu2"
source = "relu2.py"

[[kernel.testcases]]
command = "{sys.executable} check.py"
""")
    result = build_json(root)
    assert result["failed"] == []
    results = [json.loads(p.read_text()) for p in (root / "workspaces/store").glob("*/*/result.json")]
    reports = {
        k: json.loads((root / f"workspaces/reports/{k}/compare_report.json").read_text()) for k in ("loop", "cmd")
    }
    return reports, {r["task"]: r for r in results if "task" in r}


def _row(report: dict, impl: str) -> dict:
    return next(r for r in report["results"] if r["implementation"] == impl)


@pytest.mark.gpu
def test_an_1800_launch_implementation_profiles_within_the_cap_in_bounded_time(gpu_profiles):
    reports, _ = gpu_profiles
    profile = _row(reports["loop"], "many")["profile"]
    assert profile["state"] == "SUCCESS", profile["errors"]
    rows, cap = profile["kernels"], profile["launch_cap"]["per_kernel"]
    assert 1 <= len(rows) <= cap * len({r["name"] for r in rows}), [r["name"] for r in rows]
    assert len(rows) <= profile["launch_cap"]["total"] or profile["launch_cap"]["filter"] != KERNEL_ID
    assert profile["task_seconds"] < 120, profile["task_seconds"]
    assert profile["timeout_s"] <= 600
    if _row(reports["loop"], "many")["performance_state"] == "SUCCESS":  # derived from its measured time
        assert profile["timeout_basis"]["median_us"] > 0


@pytest.mark.gpu
def test_no_timing_waited_on_a_profile(gpu_profiles):
    _, tasks = gpu_profiles
    timing_ends = [t["task_started_unix"] + t["task_seconds"] for n, t in tasks.items() if n.startswith("timing:")]
    profile_starts = [t["task_started_unix"] for n, t in tasks.items() if n.startswith("profile:")]
    assert timing_ends and profile_starts and max(timing_ends) <= min(profile_starts) + 0.5


@pytest.mark.gpu
def test_a_clone_profiles_as_no_kernel_ran(gpu_profiles):
    reports, _ = gpu_profiles
    profile = _row(reports["loop"], "clone")["profile"]
    assert profile["state"] == "SUCCESS" and profile["kernels"] == [], profile
    assert any("no kernel ran" in note for note in profile["notes"])


@pytest.mark.gpu
def test_a_command_only_kernel_gets_labelled_profiler_durations(gpu_profiles):
    reports, _ = gpu_profiles
    row = _row(reports["cmd"], "relu2")
    assert row["numerics"] == "checked by the testcase command" and row["correctness_state"] == "SUCCESS"
    assert row["performance_state"] == "SKIPPED"  # no timed measurement: nothing to rank by
    profile = row["profile"]
    assert profile["state"] == "SUCCESS", profile["errors"]
    timed = row["profiler_time"]
    assert timed["method"] == profile_action.PROFILER_TIME_METHOD and timed["kernel_us"] > 0
    assert 1 <= timed["launches"] <= profile["launch_cap"]["total"]
    assert all(k["duration_us"] > 0 for k in profile["kernels"])


def test_a_profiled_process_opens_the_gpu_its_timing_ran_on_alone(tmp_path, monkeypatch):
    """On a host of several GPUs the evaluator's sandboxes open its GPU's node alone and record
    which (`gpu_minors`); the profile of the same code, and of a command testcase, opens that
    node alone too, and the profiled process then names its GPU device 0. Without a record
    (one GPU, an older result) the sandbox opens every GPU's node, as before."""
    monkeypatch.delenv("MAGPIE_TRUST_CODE", raising=False)
    job = fake_job(tmp_path, testcases=SPEC)
    job.dep_results["timing:k/cand"]["gpu_minors"] = [1]
    work = tmp_path / "work"
    work.mkdir()
    target = profile_action.implementation_target(job, work, BOUNDS)
    assert target.policy.gpu_minors == [1]
    assert json.loads((work / "request.json").read_text())["device"] == "cuda:0"
    command = {"command": "true", "working_dir": None, "env": {}}
    job.dep_results["correctness:k/cand"]["gpu_minors"] = [1]
    assert profile_action.command_target(job, work, BOUNDS, 0, command).policy.gpu_minors == [1]
    older = fake_job(tmp_path, testcases=SPEC)
    assert profile_action.implementation_target(older, work, BOUNDS).policy.gpu_minors is None
    assert json.loads((work / "request.json").read_text())["device"] is None
