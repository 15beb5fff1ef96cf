"""Every op TraceLens models, known to magpie: its category, its family sheet and, for ATen's ops,
a perf model; and each family magpie added for them checked against counts made by hand.

`tests/fixtures/tracelens_ops.json` is TraceLens's own table, read from its source at a pinned
commit by `bench/tracelens_op_table.py`: rerun that on a newer TraceLens and these tests name the
ops to add.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from magpie.traces.ingest import CpuOp, load_trace

TABLE = json.loads((Path(__file__).parent / "fixtures" / "tracelens_ops.json").read_text())
F32, BF16 = "float", "c10::BFloat16"
# The non-ATen ops TraceLens models that magpie counts (tests/test_vendor_perf_models.py checks each family).
MODELLED_NON_ATEN = {
    "FlashAttnFunc",
    "flash_attn::_flash_attn_forward",
    "flash_attn::_flash_attn_backward",
    "flash_attn::_flash_attn_varlen_forward",
    "flash_attn::_flash_attn_varlen_backward",
    "flash_attn_3::fwd",
    "aiter::_flash_attn_forward",
    "aiter::_flash_attn_backward",
    "aiter::wrapper_fmha_v3_fwd",
    "aiter::wrapper_fmha_v3_bwd",
    *(op for op, entry in TABLE["models"].items() if entry["model"] == "gemm_a8w8_blockscale"),
    "aiter::silu_and_mul",
    "_C::silu_and_mul",
    "sgl_kernel::silu_and_mul",
    "aiter::gelu_and_mul",
    "aiter::gelu_tanh_and_mul",
    "primus_turbo::hipblaslt_gemm_fp8",
    "primus_turbo_cpp_extension::hipblaslt_gemm_fp8",
    "aiter::gemm_a16w16",
    "aiter::gemm_a16w16_atomic_",
    "sglang_profiler::gemm_kernels_flydsl_hgemm",
    "aiter::_gemm_a16w16_asm",
    "vllm::rocm_unquantized_gemm",
    "aiter::rms_norm",
    "aiter::rmsnorm2d_fwd_ck",
    "aiter::rmsnorm",
    "aiter::rmsnorm2d_fwd_with_add_ck",
    "aiter::add_rmsnorm",
}
# The ops TraceLens models that magpie counts nothing for yet (their perf cells blank, their
# category and sheet TraceLens's): vLLM's and AITER's attention (packed sequences, paged caches) and
# the vendor libraries' ops (AITER, Primus, SGLang, vLLM-ROCm, TE, bitsandbytes, TensorRT-LLM, Liger,
# DeepSpeed, Mamba, MoE pseudo ops).
PENDING_NON_ATEN = {op for op in TABLE["models"] if not op.startswith("aten::")} - MODELLED_NON_ATEN


def _op(name, dims, types, concrete=None, strides=None):
    return CpuOp(name, 0.0, 1.0, 1, 1, dims, types, concrete, strides)


def _sheet(category: str, family: str) -> str:
    """The file TraceLens writes a family's rows to (its report splits all but four by direction)."""
    if family in ("GEMM", "UnaryElementwise", "BinaryElementwise", "Normalization"):
        return family
    return family + ("_bwd" if category.endswith("_bwd") else "_fwd")


def test_every_op_tracelens_knows_has_its_category_and_sheet():
    from magpie.traces import tracelens_ops
    from magpie.traces.perf_models import TRACELENS_MODELS, models_whole_op

    assert TABLE["source"]["commit"] == "171dd74721ca1ec45709e5805b68ae1f65e27811" and len(TABLE["models"]) == 245

    # a category-only entry wins over the model's category, as in TraceLens's registry
    wrong = {
        op: (tracelens_ops.CATEGORY.get(op), TRACELENS_MODELS.get(op))
        for op, model in TABLE["models"].items()
        if (tracelens_ops.CATEGORY.get(op), TRACELENS_MODELS.get(op))
        != (TABLE["category_only"].get(op, model["category"]), _sheet(model["category"], model["sheet"]))
    }
    wrong.update(
        {
            op: tracelens_ops.CATEGORY.get(op)
            for op, category in TABLE["category_only"].items()
            if tracelens_ops.CATEGORY.get(op) != category
        }
    )
    assert not wrong, f"ops TraceLens {TABLE['source']['commit'][:8]} knows otherwise: {wrong}"
    assert set(TRACELENS_MODELS) == set(TABLE["models"])  # nothing modelled whole that TraceLens does not
    assert all(models_whole_op(op) for op in TABLE["models"])
    assert [list(p) for p in tracelens_ops.NAME_PATTERNS] == [[p.lstrip("^"), c] for p, c in TABLE["name_patterns"]]


def test_every_aten_op_tracelens_models_has_a_magpie_model():
    """TraceLens's ATen ops all get FLOPs and bytes from magpie (its instance-norm backward, which
    TraceLens leaves undefined, excepted); what else lacks a model is exactly the listed set."""
    from magpie.traces.perf_models import REGISTRY, UNCOUNTED

    lacking = {op for op in TABLE["models"] if op not in REGISTRY and op not in UNCOUNTED}
    assert not {op for op in lacking if op.startswith("aten::")}
    assert lacking == PENDING_NON_ATEN
    assert UNCOUNTED == {op for op in TABLE["models"] if TABLE["models"][op]["model"] == "InstanceNormBwd"}


def test_categories_follow_tracelens_tables_then_names_then_kernels():
    from magpie.traces.ingest import GpuActivity
    from magpie.traces.ops_tables import op_category

    assert op_category("aten::cumsum", []) == "reduce"  # issue 45: was "other"
    assert op_category("aten::group_norm", []) == "NORM_fwd"
    assert op_category("aten::native_batch_norm_backward", []) == "NORM_bwd"
    assert op_category("aten::cudnn_convolution", []) == "CONV_fwd"  # TraceLens's category-only table
    assert op_category("triton_poi_fused_add_0", []) == "triton"
    elementwise = GpuActivity("void at::native::vectorized_elementwise_kernel<4>(int)", "kernel", 0.0, 1.0, 0, 7, None)
    assert op_category("aten::linear", [elementwise]) == "elementwise"  # magpie models it, TraceLens does not
    assert op_category("aten::cat", []) == "other"


def test_scans_and_other_reductions_by_hand():
    from magpie.traces.perf_models import estimate

    cumsum = estimate(_op("aten::cumsum", [[8, 1024], [], []], [F32, "Scalar", ""], ["", "-1", ""]))
    assert (cumsum.flops, cumsum.bytes) == (8 * 1024, 2 * 8 * 1024 * 4)  # one output per input element
    assert cumsum.params["num_output_elems"] == 8 * 1024 and cumsum.params["reduce_type"] == "sum"
    cumprod = estimate(_op("aten::cumprod", [[4, 6], [], []], [BF16, "Scalar", ""], ["", "0", ""]))
    assert cumprod.bytes == 2 * 24 * 2
    logsumexp = estimate(
        _op("aten::logsumexp", [[4, 16, 32], [], []], [F32, "ScalarList", "Scalar"], ["", "[2]", "False"])
    )
    assert (logsumexp.flops, logsumexp.bytes) == (4 * 16 * 32, (4 * 16 * 32 + 4 * 16) * 4)
    # linalg_norm(self, ord, dim, keepdim, dtype): the dims come after the order
    norm = estimate(
        _op(
            "aten::linalg_norm",
            [[6, 10], [], [], [], []],
            [F32, "Scalar", "ScalarList", "Scalar", ""],
            ["", "2", "[1]", "False", ""],
        )
    )
    assert norm.params["num_output_elems"] == 6 and norm.params["reduce_type"] == "norm"
    whole = estimate(_op("aten::norm", [[6, 10], []], [F32, "Scalar"], ["", "2"]))
    assert whole.params["num_output_elems"] == 1  # the order is not a dim


@pytest.mark.parametrize("name", ["aten::native_batch_norm", "aten::batch_norm", "aten::cudnn_batch_norm"])
def test_batch_norm_forward_by_hand(name):
    from magpie.traces.perf_models import estimate

    n, c = 2 * 64 * 8 * 8, 64
    dims = [[2, 64, 8, 8], [64], [64], [64], [64], [], [], []]
    train = estimate(_op(name, dims, [BF16] * 5 + ["Scalar"] * 3, ["", "", "", "", "", "True", "0.1", "1e-05"]))
    assert train.flops == 3 * c + 3 * n + 3 * c + 2 * n
    assert train.bytes == (2 * n + 6 * c) * 2  # mean, var, weight, bias, and the two saved statistics
    assert train.params["num_channels"] == c and train.params["is_training"] and train.params["is_affine"]
    inference = estimate(_op(name, dims, [BF16] * 5 + ["Scalar"] * 3, ["", "", "", "", "", "False", "0.1", "1e-05"]))
    assert (inference.flops, inference.bytes) == (6 * c + 2 * n, (2 * n + 4 * c) * 2)


def test_group_and_instance_norm_by_hand():
    from magpie.traces.perf_models import estimate

    n = 2 * 32 * 16 * 16
    group = estimate(
        _op(
            "aten::group_norm",
            [[2, 32, 16, 16], [], [32], [32], [], []],
            [F32, "Scalar", F32, F32, "Scalar", "Scalar"],
            ["", "8", "", "", "1e-05", "True"],
        )
    )
    assert group.flops == 5 * n + 6 * 32 and group.bytes == (2 * n + 6 * 32) * 4
    native = estimate(
        _op(
            "aten::native_group_norm",
            [[2, 32, 16, 16], [], [], [], [], [], [], []],
            [F32] + ["Scalar"] * 7,
            ["", "", "", "2", "32", "256", "8", "1e-05"],
        )
    )
    assert native.bytes == (2 * n + 4 * 32) * 4 and not native.params["is_affine"]  # no weight, no bias
    # group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask): per group
    backward = estimate(
        _op(
            "aten::native_group_norm_backward",
            [[2, 32, 16, 16], [2, 32, 16, 16], [2, 8], [2, 8], [32], [], [], [], [], []],
            [F32] * 5 + ["Scalar"] * 4 + [""],
            ["", "", "", "", "", "2", "32", "256", "8", "[True, True, True]"],
        )
    )
    per_channel = n / 4
    assert backward.params["num_channels"] == 4 and backward.flops == 4 * 9 * per_channel
    assert backward.bytes == (n + 2 * n + 4 + 4 + 2 * 4) * 4
    instance = estimate(
        _op(
            "aten::instance_norm",
            [[4, 3, 10, 10], [3], [3], [], [], [], [], [], []],
            [F32] * 3 + [""] * 6,
            ["", "", "", "", "", "True", "0.1", "1e-05", "False"],
        )
    )
    assert instance.flops == 5 * 1200 + 6 * 3


def test_norm_backwards_and_rms_norm_by_hand():
    from magpie.traces.perf_models import estimate

    n, c = 4 * 128, 128
    # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
    # train, eps, output_mask)
    bn = estimate(
        _op(
            "aten::native_batch_norm_backward",
            [[4, 128], [4, 128], [128], [128], [128], [128], [128], [], [], []],
            [F32] * 7 + ["Scalar", "Scalar", ""],
            ["", "", "", "", "", "", "", "True", "1e-05", "[True, True, True]"],
        )
    )
    assert bn.flops == c * 9 * (n / c) and bn.bytes == (3 * n + c + c + 2 * c) * 4
    cudnn = estimate(
        _op(
            "aten::cudnn_batch_norm_backward",
            [[4, 128], [4, 128], [128], [128], [128], [128], [128], [], []],
            [F32] * 7 + ["Scalar", ""],
            ["", "", "", "", "", "", "", "1e-05", ""],
        )
    )
    assert cudnn.flops == c * (3 + 4 * (n / c)) and cudnn.bytes == (2 * n + c) * 4  # eval statistics
    rms = estimate(
        _op("aten::_fused_rms_norm", [[4, 128], [], [128], []], [BF16, "", BF16, "Scalar"], ["", "[128]", "", "1e-06"])
    )
    assert rms.flops == 4 * (2 * 128 + 2) + 2 * n and rms.bytes == (2 * n + c) * 2
    # _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask)
    rms_bwd = estimate(
        _op(
            "aten::_fused_rms_norm_backward",
            [[4, 128], [4, 128], [], [4, 1], [128], []],
            [BF16, BF16, "", F32, BF16, ""],
            ["", "", "[128]", "", "", "[True, True]"],
        )
    )
    assert rms_bwd.flops == 2 * n + 6 * n + 2 * n and rms_bwd.bytes == (3 * n + 2 * c) * 2
    layer = estimate(
        _op(
            "aten::layer_norm",
            [[8, 256], [], [256], [256], [], []],
            [BF16, "", BF16, BF16, "Scalar", "Scalar"],
            ["", "[256]", "", "", "1e-05", "True"],
        )
    )
    assert layer.flops == 5 * 2048 + 6 * 256 and layer.bytes == (2 * 2048 + 6 * 256) * 2


def test_pads_and_nearest_upsampling_by_hand():
    from magpie.traces.perf_models import estimate

    pad = estimate(
        _op("aten::replication_pad2d", [[1, 3, 8, 8], []], [F32, ""], ["", "[1, 2, 3, 4]"], [[192, 64, 8, 1], []])
    )
    assert pad.params["output_shape"] == (1, 3, 8 + 3 + 4, 8 + 1 + 2) and pad.params["padding"] == [1, 2, 3, 4]
    assert pad.flops == 3 * 15 * 11 and pad.bytes == (192 + 3 * 15 * 11) * 4
    assert pad.params["stride_input"] == (192, 64, 8, 1)
    up = estimate(_op("aten::upsample_nearest2d", [[2, 4, 5, 5], [], []], [BF16, "", ""], ["", "[10, 10]", ""]))
    assert up.params["op_shape"] == (2, 4, 10, 10) and up.bytes == (200 + 800) * 2 and up.flops == 800


def test_convolution_backward_is_two_forward_convolutions_and_the_bias():
    from magpie.traces.perf_models import estimate

    x, w, out = [8, 16, 32, 32], [32, 16, 3, 3], [8, 32, 32, 32]
    concrete = ["", "", "", "[32]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, True]"]
    est = estimate(
        _op("aten::convolution_backward", [out, x, w, [], [], [], [], [], [], [], []], [BF16] * 3 + [""] * 8, concrete)
    )
    forward = 2 * 8 * 32 * 32 * 32 * 16 * 9
    out_numel, x_numel, w_numel = math.prod(out), math.prod(x), math.prod(w)
    assert est.flops == 2 * forward + out_numel
    assert est.bytes == (2 * (out_numel + x_numel + w_numel) + out_numel + 32) * 2
    assert est.params["input_shape"] == tuple(x) and est.params["bias"] and est.precision == "bf16_tensor"


def test_a_cumsum_in_a_trace_is_a_reduce_row_on_the_reduce_sheet(tmp_path):
    """Issue 45: a trace's cumsum lands in "reduce" (not "other") in the by-category sums, and on
    the Reduce_fwd sheet with its model's numbers."""
    from magpie.traces.perf_rows import trace_tables

    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::cumsum",
            "ts": 0,
            "dur": 10,
            "pid": 1,
            "tid": 1,
            "args": {
                "Input Dims": [[64, 512], [], []],
                "Input type": ["float", "Scalar", ""],
                "Input Strides": [[512, 1], [], []],
                "Concrete Inputs": ["", "1", ""],
            },
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 1,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "void at_cuda_detail::cub::DeviceScanKernel<float>(float*)",
            "ts": 5,
            "dur": 4,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 7},
        },
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    _, tables = trace_tables(load_trace(path))
    assert [r["op category"] for r in tables["ops_summary_by_category"]] == ["reduce"]
    (row,) = tables["Reduce_fwd"]
    assert row["name"] == "aten::cumsum" and row["GFLOPS_first"] == 64 * 512 / 1e9


def test_flash_attention_forward_and_backward_by_hand():
    from magpie.traces.perf_models import causal_pairs, estimate

    q, kv = [2, 128, 8, 64], [2, 128, 2, 64]  # (batch, seq, heads, dim), grouped-query heads
    forward = estimate(
        _op(
            "flash_attn::_flash_attn_forward",
            [q, kv, kv, [], [], [], [], []],
            [BF16] * 3 + ["Scalar"] * 5,
            ["", "", "", "0.0", "0.125", "True", "-1", "-1"],
            [[65536, 512, 64, 1], [16384, 128, 64, 1], [16384, 128, 64, 1], [], [], [], [], []],
        )
    )
    assert forward.flops == 2 * 2 * 8 * causal_pairs(128, 128) * (64 + 64)
    assert forward.bytes == (2 * 128 * 8 * 64 * 2 + 2 * 2 * 128 * 2 * 64) * 2
    assert forward.params["q_stride"] == (65536, 512, 64, 1) and forward.params["causal"]
    assert (
        estimate(
            _op(
                "FlashAttnFunc",
                [q, kv, kv, [], [], []],
                [BF16] * 3 + ["Scalar"] * 3,
                ["", "", "", "0.0", "0.125", "False"],
            )
        ).flops
        == 2 * 2 * 8 * 128 * 128 * 128
    )
    # (dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal...) as TraceLens reads it
    backward = estimate(
        _op(
            "flash_attn::_flash_attn_backward",
            [q, q, kv, kv, q, [2, 8, 128]] + [[]] * 6,
            [BF16] * 5 + [F32] + [""] * 6,
            [""] * 8 + ["0.0", "", "False", ""],
        )
    )
    pairs = 128 * 128
    assert backward.flops == 2 * 2 * 8 * pairs * (3 * 64 + 2 * 64) + 2 * 128 * 128 * (8 // 2 - 1)
    assert backward.bytes == (2 * (2 * 128 * 8 * 64 + 2 * 2 * 128 * 2 * 64) + 2 * 128 * 8 * 64) * 2


def test_a_sum_given_a_dtype_reduces_every_dim():
    """sum(x, dtype=...) records the dtype as a Scalar ('6' is float), not a dim to reduce."""
    from magpie.traces.ingest import CpuOp
    from magpie.traces.perf_models import estimate

    whole = estimate(CpuOp("aten::sum", 0.0, 0.0, 0, 0, [[8, 64, 64], []], ["float", "Scalar"], ["", "6"]))
    along_last = estimate(
        CpuOp(
            "aten::sum",
            0.0,
            0.0,
            0,
            0,
            [[8, 64, 64], [], [], []],
            ["float", "ScalarList", "Scalar", ""],
            ["", "[-1]", "False", ""],
        )
    )
    assert whole.params["num_output_elems"] == 1
    assert along_last.params["num_output_elems"] == 8 * 64
