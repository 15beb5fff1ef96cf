"""Trace-to-trace comparison (`magpie benchmark --compare-traces BEFORE AFTER`) on the H200 fixture traces."""

import csv
import gzip
import json
import shutil

import pytest

from conftest import FIXTURES, magpie_in_process
from magpie.traces.compare import COLUMNS, FASTER, NEW, NO_REPEATS, SLOWER, VANISHED, WITHIN, compare_traces, verdict

TRACES = FIXTURES / "traces" / "h200"
DECODE = TRACES / "llama_decode_bf16.json.gz"


def _scaled(source, target, factor=1.0, kernels=lambda name: True):
    """A copy of a trace with the durations of the chosen kernels (and, at factor f for all,
    every GPU activity) multiplied: a known change to find."""
    raw = source.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    for event in doc["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and kernels(event["name"]):
            event["dur"] = event["dur"] * factor
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(doc))
    return target


def test_a_trace_against_itself_is_unchanged_everywhere(tmp_path):
    proc = magpie_in_process("benchmark", "--compare-traces", DECODE, DECODE, "-o", tmp_path / "out", "--top-k", "3",
                             cwd=tmp_path, check=0)
    assert "1.000x, within noise" in proc.stdout and "written:" in proc.stdout
    summary = json.loads((tmp_path / "out/trace_compare.json").read_text())
    assert list(summary) == ["before", "after", "repeats", "rule", "total_kernel_time_us", "counts", "ops",
                             "kernels", "warnings", "outputs"]
    for rows in (summary["ops"], summary["kernels"]):
        assert rows and all(r["status"] == "common" and r["verdict"] == WITHIN and r["diff_us"] == 0 for r in rows)
        assert all(r["ratio"] == 1.0 for r in rows if r["before_us"] > 0)
    assert summary["counts"]["op"][NEW] == summary["counts"]["op"][VANISHED] == 0
    with open(tmp_path / "out/trace_compare.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == COLUMNS and len(rows) == len(summary["ops"]) + len(summary["kernels"])
    page = (tmp_path / "out/trace_compare.html").read_text()
    assert "Per op signature" in page and "Per kernel" in page and "within noise" in page


def test_two_different_traces_show_new_and_vanished_ops(tmp_path):
    summary = compare_traces(TRACES / "train_step_mlp.json.gz", TRACES / "conv_bf16.json.gz", tmp_path)
    ops = {r["name"]: r for r in summary["ops"]}
    assert ops["aten::cudnn_convolution"]["status"] == NEW and ops["aten::cudnn_convolution"]["before_us"] == 0
    assert ops["aten::addmm"]["status"] == VANISHED and ops["aten::addmm"]["after_us"] == 0
    assert ops["aten::cudnn_convolution"]["verdict"] == NEW and ops["aten::addmm"]["ratio"] == 0
    assert summary["counts"]["op"][NEW] > 0 and summary["counts"]["kernel"][VANISHED] > 0
    diffs = [abs(r["diff_us"]) for r in summary["ops"]]
    assert diffs == sorted(diffs, reverse=True)


def test_a_scaled_kernel_is_found_with_its_ratio_and_judged_against_the_repeats(tmp_path):
    gemm = lambda name: name.startswith("nvjet")  # noqa: E731
    # before: the trace and a copy 1% slower everywhere (run-to-run noise); after: the GEMMs 1.5x
    # slower, and that 1% slower again
    (tmp_path / "a").mkdir()
    shutil.copy(DECODE, tmp_path / "a" / "r1.json.gz")
    _scaled(DECODE, tmp_path / "a" / "r2.json", 1.01)
    _scaled(DECODE, tmp_path / "b" / "r1.json", 1.5, gemm)
    scaled = _scaled(tmp_path / "b" / "r1.json", tmp_path / "b2.json", 1.01)
    # one trace a side: the ratio is there, but there is no noise to judge it by
    single = compare_traces(DECODE, tmp_path / "b" / "r1.json", tmp_path / "single")
    for row in single["kernels"]:
        expected = 1.5 if gemm(row["name"]) else 1.0
        assert row["ratio"] == pytest.approx(expected, rel=1e-9)
        assert row["verdict"] == (NO_REPEATS if gemm(row["name"]) else WITHIN)
    mm = [r for r in single["ops"] if r["name"] == "aten::mm"]
    assert mm and all(r["ratio"] == pytest.approx(1.5, rel=1e-3) for r in mm)
    # repeats: a folder one side, a comma list the other
    proc = magpie_in_process("benchmark", "--compare-traces", tmp_path / "a", f"{tmp_path / 'b' / 'r1.json'},{scaled}",
                             "-o", tmp_path / "out", "--json", cwd=tmp_path, check=0)
    summary = json.loads(proc.stdout)
    assert summary["repeats"] == {"before": 2, "after": 2}
    for row in summary["kernels"]:
        assert row["verdict"] == (SLOWER if gemm(row["name"]) else WITHIN), row["name"]
        assert row["noise_us"] > 0
    assert {r["verdict"] for r in summary["ops"] if r["name"] == "aten::mm"} == {SLOWER}
    assert summary["total_kernel_time_us"]["verdict"] == SLOWER
    assert '<td class="slower">slower</td>' in (tmp_path / "out/trace_compare.html").read_text()
    # and the other way round it is faster
    back = compare_traces(f"{tmp_path / 'b' / 'r1.json'},{scaled}", tmp_path / "a", tmp_path / "back")
    assert {r["verdict"] for r in back["kernels"] if gemm(r["name"])} == {FASTER}


def test_the_noise_rule():
    assert verdict([10.0], [10.0]) == (WITHIN, None)
    assert verdict([10.0], [11.0]) == (NO_REPEATS, None)
    assert verdict([10.0, 11.0], [10.5, 11.5]) == (WITHIN, 1.0)  # overlapping repeats
    assert verdict([10.0, 10.2], [12.0, 12.1]) == (SLOWER, pytest.approx(0.2))
    assert verdict([12.0, 12.1], [10.0, 10.2])[0] == FASTER
    # apart, but by less than the spread between repeats
    assert verdict([10.0, 10.1], [10.11, 10.12])[0] == WITHIN
    # one repeat on one side: the other side's spread is the noise
    assert verdict([10.0, 10.2], [11.0])[0] == SLOWER and verdict([10.0, 10.2], [10.25])[0] == WITHIN


def test_bad_sides_are_one_line_errors_and_bad_repeats_are_skipped(tmp_path):
    proc = magpie_in_process("benchmark", "--compare-traces", tmp_path / "nowhere", DECODE, cwd=tmp_path)
    assert proc.returncode == 2 and "nowhere" in proc.stderr and proc.stderr.count("\n") == 1
    proc = magpie_in_process("benchmark", "--compare-traces", DECODE, DECODE, "--trace-dir", TRACES, cwd=tmp_path)
    assert proc.returncode == 2 and "alone" in proc.stderr
    data = DECODE.read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    summary = compare_traces(f"{DECODE},{tmp_path / 'cut.json.gz'}", DECODE, tmp_path / "out")
    assert summary["repeats"]["before"] == 1 and any("cut.json.gz" in w for w in summary["warnings"])
