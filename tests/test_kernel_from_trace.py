"""Kernels from a workload (`magpie kernel from-trace`, `traces/to_spec.py`) on the committed H200
traces: ops ranked by their share of the trace's GPU time, specs whose inputs are the recorded
signatures, and one kernel made that way built and judged on the CPU."""

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, build_json, magpie_in_process, write

from magpie.harness import wire
from magpie.harness.spec import Case, ReferenceSpec
from magpie.manifest.load import tomllib  # tomli before Python 3.11

TRACES = FIXTURES / "traces/h200"
DECODE = TRACES / "llama_decode_bf16.json.gz"


def from_trace(cwd: Path, trace: Path, *args, check=0) -> dict | str:
    proc = magpie_in_process("kernel", "from-trace", trace, *args, "--json", cwd=cwd, check=check)
    return json.loads(proc.stdout) if check == 0 else proc.stderr


def test_ops_are_ranked_by_their_share_of_the_workload_and_those_that_cannot_be_specs_say_why(tmp_path):
    found = from_trace(tmp_path, DECODE)
    ops = {row["op"]: row for row in found["ops"]}
    totals = [row["total_us"] for row in found["ops"]]
    assert totals == sorted(totals, reverse=True) and found["ops"][0]["op"] == "aten::mm"
    assert sum(row["share"] for row in found["ops"]) == pytest.approx(1.0)
    # Amdahl: attention's calls are twice as long as mul's, but mul takes four times its share of the whole
    attention, mul = ops["aten::_cudnn_attention_forward"], ops["aten::mul"]
    assert attention["total_us"] / attention["calls"] > 2 * mul["total_us"] / mul["calls"]
    assert mul["share"] > 4 * attention["share"]
    assert ops["aten::mm"]["spec"] == ops["aten::_cudnn_attention_forward"]["spec"] == "yes"
    assert ops["aten::cat"]["spec"].startswith("no: no spec for its family (copy)")
    assert ops["aten::arange"]["spec"].startswith("no: no spec for its family (no perf model)")


@pytest.fixture(scope="module")
def gemm_project(tmp_path_factory) -> tuple[Path, dict]:
    """The decode trace's two top aten::mm signatures as a kernel, with a candidate of its own:
    built once."""
    root = tmp_path_factory.mktemp("from_trace")
    found = from_trace(root, DECODE, "--op", "aten::mm", "--top", "2", "-o", "kernels/mm")
    candidate = "import torch\n\n\ndef kernel(a, b):\n    return (a.float() @ b.float()).to(a.dtype)\n"
    write(
        root,
        {
            "magpie.toml": '[project]\nname = "gemm"\n\n[defaults.timing]\nwarmup_ms = 2\nbudget_ms = 20\nrounds = 2\n\n'
            + found["kernel_toml"]
            + '\n[[kernel.candidates]]\nid = "fp32_accumulate"\nsource = "kernels/mm/fp32.py"\n',
            "kernels/mm/fp32.py": candidate,
        },
    )
    return root, found


def test_an_ops_top_signatures_become_testcases_with_the_recorded_shapes_dtypes_and_strides(gemm_project):
    root, found = gemm_project
    shares = [s["share"] for s in found["signatures"]]
    assert len(shares) == 2 and shares == sorted(shares, reverse=True)
    top = found["signatures"][0]
    # the weight is recorded transposed (column-major): so it is made
    assert top["inputs"] == [
        {"dims": [4, 512], "dtype": "bfloat16", "strides": [512, 1]},
        {"dims": [512, 1408], "dtype": "bfloat16", "strides": [1, 512]},
    ]
    table = tomllib.loads(found["kernel_toml"])["kernel"][0]
    assert [tc["inputs"] for tc in table["testcases"]] == ["inputs_0", "inputs_1"]
    assert table["testcases"][0]["shapes"] == [[4, 512, 1408]] and table["testcases"][0]["dtypes"] == ["bfloat16"]
    assert (table["testcases"][0]["rtol"], table["testcases"][0]["atol"]) == (0.016, 0.01)
    assert (root / "kernels/mm/spec.py").is_file() and (root / "kernels/mm/baseline.py").is_file()


def test_a_kernel_made_from_a_trace_builds_and_judges_candidates_on_recorded_and_held_out_shapes(gemm_project):
    root, _ = gemm_project
    assert build_json(root, "-j", "2")["failed"] == []
    report = json.loads((root / "workspaces/reports/aten_mm/compare_report.json").read_text())
    rows = {row["implementation"]: row for row in report["results"]}
    for name in ("recorded", "fp32_accumulate"):
        assert (rows[name]["correctness_state"], rows[name]["verdict"]) == ("SUCCESS", "correct")
        assert len(rows[name]["held_out"]["shapes"]) == 2, rows[name]["held_out"]
    assert rows["fp32_accumulate"]["performance_state"] == "SUCCESS"


@pytest.mark.parametrize(
    ("trace", "op", "output"),
    [
        ("llama_decode_bf16", "aten::mul", [4, 1, 512]),  # a broadcast weight
        ("llama_decode_bf16", "aten::copy_", [4, 1, 512]),  # in place: its functional form, a dtype cast
        ("llama_decode_bf16", "aten::mean", [4, 1, 1]),  # its dtype recorded in a keyword-only place
        ("llama_unannotated", "aten::_cudnn_attention_forward", [4, 8, 80, 64]),  # causal, grouped heads
        ("train_step_mlp", "aten::native_layer_norm", [512, 4096]),  # the first of its outputs
        ("op_coverage", "aten::_softmax", [8, 64, 64]),
    ],
)
def test_a_spec_from_a_trace_makes_the_recorded_inputs_and_calls_the_recorded_op(tmp_path, trace, op, output):
    found = from_trace(tmp_path, TRACES / f"{trace}.json.gz", "--op", op, "--top", "1", "-o", "k")
    top = found["signatures"][0]
    testcase = wire.Testcase(inputs="inputs_0", reference="reference", shapes=[top["sizes"]], dtypes=[top["dtype"]])
    spec = ReferenceSpec(tmp_path / "k/spec.py", testcase, "cpu")
    args = spec.make_inputs(Case("recorded", top["sizes"], top["dtype"], 0, 1))
    made = [
        {"dims": list(a.shape), "dtype": str(a.dtype).removeprefix("torch."), "strides": list(a.stride()) or None}
        for a in args
        if hasattr(a, "shape")
    ]
    assert made == top["inputs"]
    assert list(spec.reference(args, 0).shape) == output


def test_an_op_that_cannot_be_a_spec_or_is_not_in_the_trace_is_one_line(tmp_path):
    cat = from_trace(tmp_path, DECODE, "--op", "aten::cat", check=2)
    assert cat.strip() == (
        "magpie: aten::cat: cannot be made into a spec: no spec for its family (copy); made for GEMM, "
        "attention, norms, elementwise ops, reductions and softmax"
    )
    absent = from_trace(tmp_path, DECODE, "--op", "aten::conv2d", check=2)
    assert (
        absent.startswith("magpie: aten::conv2d: not an op of this trace (its ops: ") and len(absent.splitlines()) == 1
    )
    folder = from_trace(tmp_path, TRACES, check=2)
    assert folder == f"magpie: {TRACES}: is a folder: name one trace in it (e.g. {TRACES}/conv_bf16.json.gz)\n"


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("trace", "op"),
    [("llama_decode_bf16", "aten::mm"), ("llama_unannotated", "aten::_cudnn_attention_forward")],
)
def test_a_kernel_made_from_a_trace_is_built_and_timed_on_the_gpu(tmp_path, trace, op):
    """The recorded signatures on the GPU they came from: the recorded strides made there, the
    baseline (the recorded op, or attention by scaled_dot_product_attention) correct and timed."""
    found = from_trace(tmp_path, TRACES / f"{trace}.json.gz", "--op", op, "--top", "2", "-o", "kernels/k")
    write(
        tmp_path,
        {
            "magpie.toml": '[project]\nname = "gpu"\ndevice = "cuda"\n\n[defaults.timing]\nbudget_ms = 50\n\n'
            + found["kernel_toml"]
        },
    )
    assert build_json(tmp_path)["failed"] == []
    report = json.loads(next((tmp_path / "workspaces/reports").glob("*/compare_report.json")).read_text())
    row = report["results"][0]
    assert (row["correctness_state"], row["performance_state"]) == ("SUCCESS", "SUCCESS"), row["verdict"]
