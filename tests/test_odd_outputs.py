"""Outputs of an odd form (sparse, nested, on another device, of a Tensor subclass) are the
implementation's failure, in words that say what is wrong with them (issue 38.6); before,
a sparse output failed as "evaluator error", the fault put on magpie."""

import json

import pytest
from conftest import ODD_OUTPUTS, build_json, relu2_project

# implementation: (correctness_state, failure kind, the verdict's words)
EXPECTED = {
    "returns_sparse": (
        "FAILED",
        "layout",
        "output 0 is a sparse tensor (torch.sparse_coo); a dense tensor is expected",
    ),
    "returns_nested": ("FAILED", "layout", "output 0 is a nested tensor; a dense tensor is expected"),
    "returns_on_meta": ("FAILED", "device", "output 0 is on meta; the inputs are on cpu"),
    "returns_subclass": (
        "FAILED",
        "type",
        "output 0 is a Sneaky (a subclass of torch.Tensor); a plain torch.Tensor is expected",
    ),
    # strides are not judged: the same values in another layout are correct
    "returns_transposed": ("SUCCESS", None, "correct"),
}


@pytest.fixture(scope="module")
def report(adversarial_reports):
    assert set(EXPECTED) == set(ODD_OUTPUTS)
    return adversarial_reports["odd_outputs"]


@pytest.mark.parametrize("impl", list(EXPECTED))
def test_an_odd_output_is_the_implementations_failure_and_says_why(report, impl):
    row = next(r for r in report["results"] if r["implementation"] == impl)
    state, kind, words = EXPECTED[impl]
    assert row["correctness_state"] == state, row["verdict"]
    assert words in row["verdict"] and "evaluator" not in row["verdict"], row["verdict"]
    if kind is not None:
        assert row["failures"][0]["kind"] == kind and row["failures"][0]["stage"] == "correctness", row["failures"]


def test_the_evaluators_checks_judge_an_odd_output_that_reaches_them():
    """The worker's own check runs in the candidate's process, which its code can change: what
    then reaches the evaluator (a sparse or nested tensor read from the output file) is judged
    there too, never raised as the evaluator's error."""
    import torch

    from magpie.harness.checks import all_finite, compare_outputs, surely_close

    expected = torch.ones(4, 4)
    for odd, kind in (
        (expected.to_sparse(), "layout"),
        (expected.to_sparse_csr(), "layout"),
        (torch.nested.nested_tensor([torch.ones(4)] * 4), "layout"),
    ):
        record = compare_outputs(odd, expected, 1e-5, 1e-6)
        assert not record["passed"] and record["kind"] == kind and "a dense tensor is expected" in record["detail"]
        assert not surely_close(odd, expected, 1e-5, 1e-6)
        assert all_finite(odd)["kind"] == kind
    assert compare_outputs(expected.t(), expected, 1e-5, 1e-6)["passed"]


@pytest.mark.gpu
def test_an_output_left_on_the_host_or_sparse_fails_on_the_gpu(tmp_path):
    """On a GPU the outputs are copied into buffers the evaluator lent: a host tensor was moved
    there and a sparse one made dense, both judged correct; now each fails, in its words."""
    relu2_project(
        tmp_path,
        ["returns_on_cpu", "returns_sparse"],
        shapes="[[33, 65]]",
        defaults="timeout_s = 60",
        device="cuda",
        timing="warmup_ms = 1\nbudget_ms = 20\nrounds = 2",
    )
    assert build_json(tmp_path, "-j", "2")["failed"] == []
    report = json.loads((tmp_path / "workspaces/reports/relu2/compare_report.json").read_text())
    rows = {r["implementation"]: r for r in report["results"]}
    assert rows["good"]["correctness_state"] == "SUCCESS"
    assert rows["returns_on_cpu"]["failures"][0]["kind"] == "device"
    assert "output 0 is on cpu; the inputs are on cuda:0" in rows["returns_on_cpu"]["verdict"]
    assert rows["returns_sparse"]["failures"][0]["kind"] == "layout"
