"""Machine-readable verdicts: each failing row of compare_report.json names its failure's kind,
stage and case beside the verdict a person reads; a passing row says how close it came."""

import json
import shutil
import signal

import pytest
from conftest import ADVERSARIAL, FIXTURES, magpie

from magpie.harness.kinds import command_kind, failure_kind
from magpie.sandbox import SANDBOX_FAILED
from magpie.supervision.session import signal_verdict

FIRST = "[33, 65] float32"
TIMED = "[33, 65] float32"  # the largest shape is the one timed
EXPECTED = {
    # implementation: (kind, stage, case, trial) of the row's first failure; None: where the
    # failure took the whole testcase's process with it, no case can be named
    "raises": ("error", "correctness", None, None),
    "aborts": ("crash", "correctness", None, None),
    "segfaults": ("crash", "correctness", None, None),
    "hangs": ("timeout", "correctness", None, None),
    "hogs_memory": ("out_of_memory", "correctness", None, None),
    "nan": ("finite", "correctness", FIRST, 0),
    "mutates": ("mutation", "correctness", FIRST, 0),
    # torch fills unwritten memory with the same quiet NaN that float("nan") is: from the
    # values, an element never written cannot be told from a NaN the kernel wrote
    "unwritten": ("finite", "correctness", FIRST, 0),
    "stale_cache": ("allclose", "correctness", FIRST, 1),
    "broadcast": ("shape", "correctness", FIRST, 0),
    "wrong_dtype": ("dtype", "correctness", FIRST, 0),
    "syntax_error": ("compile", "compile", None, None),
    # wrong from its 21st call: first caught on a timed call's output, then by the re-check
    "degrades": ("allclose", "timing", TIMED, None),
}


@pytest.fixture(scope="module")
def rows(adversarial_report):
    assert set(EXPECTED) <= set(ADVERSARIAL)
    return {row["implementation"]: row for row in adversarial_report["results"]}


@pytest.mark.parametrize("impl", list(EXPECTED))
def test_failure_kind_stage_and_case(rows, impl):
    row = rows[impl]
    kind, stage, case, trial = EXPECTED[impl]
    first = row["failures"][0]
    assert (first["kind"], first["stage"], first.get("case"), first.get("trial")) == (kind, stage, case, trial), first
    assert first["detail"]
    if stage != "compile":
        assert first["testcase"] == 0
    if case is not None:
        assert first["shape"] == [33, 65] and first["dtype"] == "float32"
    # the verdict and errors a person reads are still there, unchanged in kind
    assert row["errors"]


def test_what_a_failure_kept_from_running_follows_it(rows):
    assert [(f["kind"], f["stage"]) for f in rows["syntax_error"]["failures"]] == [
        ("compile", "compile"),
        ("not_compiled", "correctness"),
        ("not_correct", "timing"),
    ]
    assert [f["kind"] for f in rows["segfaults"]["failures"]] == ["crash", "not_correct"]


def test_a_numeric_failure_says_by_how_much(rows):
    first = rows["stale_cache"]["failures"][0]
    assert first["max_abs_err"] > 0 and first["max_rel_err"] > 0
    assert first["check"] == "allclose"
    # every failing case is listed (a stale answer is wrong on every later trial of both shapes)
    checked = [f for f in rows["stale_cache"]["failures"] if f["stage"] == "correctness"]
    assert {f["case"] for f in checked} == {FIRST, "[8, 128] float32"} and {f["trial"] for f in checked} == {1, 2}


def test_a_passing_row_says_how_close_it_came(rows):
    good = rows["good"]
    assert good["failures"] == [] and good["correctness_state"] == "SUCCESS"
    margin = good["numerics_margin"]
    assert margin["max_abs_err"] >= 0 and margin["max_rel_err"] >= 0 and 0 <= margin["tolerance_used"] <= 1
    assert margin["cases"] >= 2 and margin["case"] in (FIRST, "[8, 128] float32")
    assert all(
        rows[name]["numerics_margin"] is None for name in EXPECTED if rows[name]["correctness_state"] != "SUCCESS"
    )
    assert rows["degrades"]["numerics_margin"]["max_abs_err"] >= 0  # correct, then failed its timing


@pytest.mark.parametrize(
    "message, kind",
    [
        ("timeout after 8 s", "timeout"),
        (signal_verdict(-signal.SIGSEGV), "crash"),
        (signal_verdict(-signal.SIGKILL), "crash"),
        (signal_verdict(-signal.SIGSYS), "sandbox_violation"),
        (f"{signal_verdict(SANDBOX_FAILED)}: sandbox: landlock: not supported", "sandbox"),
        ("exited with code 1: Traceback", "crash"),
        ("stopped answering (closed its pipe)", "crash"),
        ("error: out of memory (MemoryError)", "out_of_memory"),
        ("error while timing good: out of memory (CUDA out of memory)", "out_of_memory"),
        ("error: ValueError: this candidate always fails", "error"),
        ("error while loading: ImportError: no module named x", "load_error"),
        ("the timer of good returned no samples", "timer_integrity"),
    ],
)
def test_worker_failure_messages_map_to_kinds(message, kind):
    assert failure_kind(message) == kind


def test_a_commands_exit_is_its_own_kind_unless_the_sandbox_stopped_it():
    assert command_kind("exited with code 1: error: expected ';'", "compile") == "compile"
    assert command_kind(f"exited with code {SANDBOX_FAILED}: sandbox: seccomp", "compile") == "sandbox"
    assert command_kind("crashed (SIGSYS)", "testcase_command") == "sandbox_violation"
    assert command_kind("crashed (SIGSEGV)", "testcase_command") == "testcase_command"


def test_analyze_report_carries_the_kind_of_a_failing_command_testcase(tmp_path):
    shutil.copy(FIXTURES / "adversarial" / "good.py", tmp_path / "good.py")
    proc = magpie(
        "analyze", "good.py", "--type", "pytorch", "--testcase", "exit 3", "--no-perf", "-o", "b", cwd=tmp_path, check=1
    )
    assert (tmp_path / "b/analyze_report.json").exists(), proc.stdout + proc.stderr
    report = json.loads((tmp_path / "b/analyze_report.json").read_text())
    assert "exited with code 3" in report["verdict"]
    first = report["failures"][0]
    assert (first["kind"], first["stage"], first["case"], first["testcase"]) == (
        "testcase_command",
        "correctness",
        "command",
        0,
    )
    assert report["numerics_margin"] is None


def test_output_checks_leave_out_only_the_references_non_finite_elements():
    """The check of one output, by itself: a reference of finite values is compared whole, one
    with NaN/Inf leaves those elements out (and needs the same there), and either way the
    error magnitudes are those of the elements compared."""
    import torch

    from magpie.harness.checks import compare_outputs

    expected = torch.randn(64, generator=torch.Generator().manual_seed(3))
    close = expected + 1e-7
    passed = compare_outputs(close, expected, 1e-5, 1e-6)
    assert passed["passed"] and 0 < passed["tolerance_used"] < 1 and passed["max_abs_err"] < 2e-7

    unwritten = close.clone()
    unwritten[5] = float("nan")
    record = compare_outputs(unwritten, expected, 1e-5, 1e-6)
    assert record["kind"] == "finite" and record["detail"].startswith("1 of 64 elements are NaN/Inf")

    off = close.clone()
    off[9] += 1e-2
    record = compare_outputs(off, expected, 1e-5, 1e-6)
    assert record["kind"] == "allclose" and "1 of 64 elements outside" in record["detail"]
    assert record["max_abs_err"] > 9e-3

    with_inf, got_inf = expected.clone(), close.clone()
    with_inf[0] = got_inf[0] = float("inf")
    masked = compare_outputs(got_inf, with_inf, 1e-5, 1e-6)
    alone = compare_outputs(close[1:], expected[1:], 1e-5, 1e-6)
    assert masked["passed"]
    for key in ("max_abs_err", "max_rel_err", "tolerance_used", "rel_err_norm"):
        assert masked[key] == pytest.approx(alone[key], rel=1e-12), key
    got_inf[0] = 1.0
    assert not compare_outputs(got_inf, with_inf, 1e-5, 1e-6)["passed"]


def test_the_quick_output_check_passes_nothing_the_full_one_fails():
    """A timed batch's sampled outputs are checked first in float32 (`surely_close`), the full
    float64 check deciding whatever that does not pass: over outputs at, near and past the
    tolerance, of four float types, with NaN, Inf and zero references, no output the full
    check fails is passed by the quick one, and honest outputs do pass it."""
    import torch

    from magpie.harness.checks import compare_outputs, surely_close

    generator = torch.Generator().manual_seed(0)
    quick_passes = 0
    for trial in range(2000):
        dtype = (torch.float32, torch.float64, torch.bfloat16, torch.float16)[trial % 4]
        rtol, atol = ((1e-5, 1e-8), (1e-2, 1e-2), (1e-3, 1e-5))[trial % 3]
        shape = (int(torch.randint(1, 300, (1,), generator=generator)),)
        expected = (
            torch.randn(shape, generator=generator, dtype=torch.float64)
            * 10.0 ** float(torch.randint(-3, 3, (1,), generator=generator))
        ).to(dtype)
        off_by = 10.0 ** float(torch.rand(1, generator=generator) * 6 - 7)
        got = (
            expected.double()
            + torch.randn(shape, generator=generator, dtype=torch.float64) * off_by * (expected.double().abs() + 1)
        ).to(dtype)
        spoil = trial % 10
        if spoil == 1:
            got[0] = float("nan")
        elif spoil == 2:
            expected[0] = float("inf")
        elif spoil == 3:
            expected.zero_()
        elif spoil == 4:
            got[-1] = float("inf")
        quick = surely_close(got, expected, rtol, atol)
        assert not quick or compare_outputs(got, expected, rtol, atol)["passed"], (trial, dtype, rtol, atol, spoil)
        quick_passes += quick
    assert quick_passes > 300
    honest = torch.randn(1 << 16, generator=generator)
    assert surely_close(honest * 1.0000001, honest, 1e-5, 1e-8)
    assert surely_close((honest.clone(), honest[:7].clone()), (honest, honest[:7]), 1e-5, 1e-8)
    assert not surely_close(honest[:7], honest, 1e-5, 1e-8)
