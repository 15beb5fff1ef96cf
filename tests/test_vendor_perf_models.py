"""FLOPs and bytes of the non-ATen ops TraceLens models, each family checked against counts made by hand."""

from __future__ import annotations

import pytest

from magpie.traces.ingest import CpuOp

BF16, INT = "c10::BFloat16", "int"


def _op(name, dims, types, concrete):
    return CpuOp(name, 0.0, 1.0, 1, 1, dims, types, concrete, None)


# Three packed sequences: 1000 query and key tokens, the longest 600 (the other two taken as 200 each),
# 8 query heads over 2 KV heads, head size 64, bf16.
Q, KV = [1000, 8, 64], [1000, 2, 64]
CU_SEQLENS = [4]


def _varlen_forward(causal: str):
    dims = [Q, KV, KV, CU_SEQLENS, CU_SEQLENS, [], [], [], [], []]
    types = [BF16, BF16, BF16, INT, INT, "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    return _op(
        "flash_attn::_flash_attn_varlen_forward", dims, types, ["", "", "", "", "", "600", "600", "0.", "0.125", causal]
    )


@pytest.mark.parametrize(
    ("causal", "flops"),
    [
        # 2·H·pairs·(d + d_v): 2·8·600²·128 = 737,280,000 for the longest, 2·8·200²·128 = 81,920,000 for each other
        ("False", 737_280_000 + 2 * 81_920_000),
        # causal pairs 600·601/2 = 180,300 and 200·201/2 = 20,100: 2·8·180,300·128 + 2 · 2·8·20,100·128
        ("True", 369_254_400 + 2 * 41_164_800),
    ],
)
def test_flash_attn_varlen_forward_counts_the_longest_sequence_and_the_mean_of_the_rest(causal, flops):
    from magpie.traces.perf_models import estimate

    found = estimate(_varlen_forward(causal))
    assert found is not None and found.family == "SDPA"
    assert found.flops == flops
    # q 1000·8·64·2 = 1,024,000 B, k and v 1000·2·64·2 = 256,000 B each, the output as q
    assert found.bytes == 1_024_000 + 2 * 256_000 + 1_024_000
    assert found.precision == "bf16_tensor"
    params = found.params
    assert (params["B"], params["N_Q"], params["H_Q"], params["N_KV"], params["H_KV"]) == (1, 1000, 8, 1000, 2)
    assert (params["num_seqs_q"], params["num_seqs_kv"], params["max_seqlen_q"], params["causal"]) == (
        3,
        3,
        600.0,
        causal == "True",
    )


def test_flash_attn_varlen_backward_counts_five_products_and_the_grouped_head_sums():
    from magpie.traces.perf_models import estimate

    # dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    # dropout_p, softmax_scale, causal
    dims = [Q, Q, KV, KV, Q, [8, 1000], Q, KV, KV, CU_SEQLENS, CU_SEQLENS, [], [], [], [], []]
    types = [BF16] * 9 + [INT, INT] + ["Scalar"] * 5
    concrete = [""] * 11 + ["600", "600", "0.", "0.125", "False"]
    found = estimate(_op("flash_attn::_flash_attn_varlen_backward", dims, types, concrete))
    assert found is not None and found.family == "SDPA"
    # per sequence 2·8·pairs·(3·64 + 2·64) plus K and V gradients summed over 4 query heads per KV head,
    # lk·(64 + 64)·3: 1,843,200,000 + 230,400 for the longest, 204,800,000 + 76,800 for each other
    assert found.flops == 1_843_430_400 + 2 * 204_876_800
    # q, k, v read and their gradients written (2 · 1,536,000 B), the output's gradient read (1,024,000 B)
    assert found.bytes == 2 * 1_536_000 + 1_024_000
    assert found.params["q_stride"] is None and found.params["num_seqs_q"] == 3


def test_flash_attn_varlen_with_unrecorded_lengths_has_no_estimate():
    from magpie.traces.perf_models import estimate

    op = _varlen_forward("False")
    assert estimate(op) is not None
    op.input_dims[3] = []  # cu_seqlens_q not recorded: the sequence count is unknown
    assert estimate(op) is None


# AITER's and flash-attn 3's unpadded attention: q (2, 128, 8, 64), k and v (2, 256, 2, 64), bf16.
DENSE_Q, DENSE_KV = [2, 128, 8, 64], [2, 256, 2, 64]


def _dense(name, q_at, length, flags):
    dims = [[]] * q_at + [DENSE_Q, DENSE_KV, DENSE_KV] + [[]] * (length - q_at - 3)
    types = [""] * q_at + [BF16] * 3 + ["Scalar"] * (length - q_at - 3)
    concrete = [""] * length
    for at, text in flags.items():
        concrete[at] = text
    return _op(name, dims, types, concrete)


@pytest.mark.parametrize(
    ("name", "q_at", "length", "flags", "flops"),
    [
        # causal, 128 queries over 256 keys aligned bottom right: 128·128 + 128·129/2 = 24,640 pairs;
        # 2 batches · 2·8·24,640·128
        ("aiter::_flash_attn_forward", 0, 8, {3: "0.0", 5: "True"}, 2 * 50_462_720),
        ("aiter::wrapper_fmha_v3_fwd", 1, 9, {4: "0.0", 6: "True"}, 2 * 50_462_720),
        # TraceLens reads causal in any case: "true" too
        ("flash_attn_3::fwd", 0, 26, {24: "true"}, 2 * 50_462_720),
        # not causal: 2 · 2·8·128·256·128
        ("aiter::_flash_attn_forward", 0, 8, {3: "0.0", 5: "False"}, 2 * 67_108_864),
    ],
)
def test_aiter_and_flash_attn_3_forward_count_as_flash_attention(name, q_at, length, flags, flops):
    from magpie.traces.perf_models import estimate

    found = estimate(_dense(name, q_at, length, flags))
    assert found is not None and found.family == "SDPA"
    assert found.flops == flops
    # q 2·128·8·64·2 = 262,144 B, k and v 2·256·2·64·2 = 131,072 B each, the output as q
    assert found.bytes == 262_144 + 2 * 131_072 + 262_144
    # TraceLens's parameters for these ops: no strides, no dtypes
    assert list(found.params) == [
        "B",
        "N_Q",
        "H_Q",
        "N_KV",
        "H_KV",
        "d_h_qk",
        "d_h_v",
        "dropout",
        "causal",
        "flash_impl",
    ]


@pytest.mark.parametrize(
    ("name", "q_at", "length", "flags"),
    [
        ("aiter::_flash_attn_backward", 0, 14, {10: "0.0", 12: "false"}),
        ("aiter::wrapper_fmha_v3_bwd", 1, 11, {9: "None"}),
    ],
)
def test_aiter_attention_backward_counts_five_products_and_the_grouped_head_sums(name, q_at, length, flags):
    from magpie.traces.perf_models import estimate

    found = estimate(_dense(name, q_at, length, flags))
    assert found is not None and found.params["causal"] is False
    # 2 batches · (2·8·128·256·(3·64 + 2·64) + 256·(64 + 64)·(8/2 − 1))
    assert found.flops == 2 * (167_772_160 + 98_304)
    # q, k, v read and their gradients written (2 · 524,288 B), the output's gradient read (262,144 B)
    assert found.bytes == 2 * 524_288 + 262_144


FP8 = "c10::Float8_e4m3fnuz"


def test_a8w8_blockscale_gemms_count_the_matmul_and_move_x_w_and_a_bf16_output():
    from magpie.traces.perf_models import estimate

    # X (256, 7168) and W (2048, 7168) fp8 with 128x128-block scales (256, 56) and (16, 56), float
    dims = [[256, 7168], [2048, 7168], [256, 56], [16, 56], []]
    types = [FP8, FP8, "float", "float", "c10::BFloat16"]
    found = estimate(_op("aiter::gemm_a8w8_blockscale_ck", dims, types, [""] * 5))
    assert found is not None and found.family == "GEMM"
    assert found.flops == 2 * 256 * 2048 * 7168  # 7,516,192,768
    # X 256·7168·1 = 1,835,008 B, W 2048·7168·1 = 14,680,064 B, Y 256·2048·2 = 1,048,576 B; the scales not counted
    assert found.bytes == 1_835_008 + 14_680_064 + 1_048_576
    assert found.params == {
        "B": 1,
        "M": 256,
        "N": 2048,
        "K": 7168,
        "bias": False,
        "dtype_A_B": (FP8, FP8, "c10::bfloat16"),
        "quant_scheme": "a8w8_blockscale",
        "quant_granularity": "per_block",
        "block_k": 128,
        "block_n": 128,
        "scale_dtype": "float",
        "output_shape": (256, 2048),
        "output_dtype": "c10::bfloat16",
    }
    # without the scales recorded, the same counts and no block sizes
    bare = estimate(_op("vllm::rocm_aiter_triton_gemm_a8w8_blockscale", dims[:2], types[:2], ["", ""]))
    assert bare is not None and (bare.flops, bare.bytes) == (found.flops, found.bytes)
    assert "block_k" not in bare.params


@pytest.mark.parametrize(
    ("name", "flops_per_element"),
    [("aiter::silu_and_mul", 5), ("_C::silu_and_mul", 5), ("aiter::gelu_and_mul", 8), ("aiter::gelu_tanh_and_mul", 10)],
)
def test_gated_activations_read_gate_and_up_and_write_the_output(name, flops_per_element):
    from magpie.traces.perf_models import estimate

    # out (4, 9, 256) bf16 from an fp32 gate+up (4, 9, 512): 9,216 output elements
    found = estimate(_op(name, [[4, 9, 256], [4, 9, 512]], [BF16, "float"], ["", ""]))
    assert found is not None and found.family == "elementwise"
    assert found.flops == flops_per_element * 9_216
    # gate and up read, 2 · 9,216 · 4 = 73,728 B; the output written, 9,216 · 2 = 18,432 B
    assert found.bytes == 73_728 + 18_432
    assert found.params["op_shape"] == (4, 9, 256) and found.params["dtype_in_out"] == ("float", BF16)
    assert found.precision == "fp32"


@pytest.mark.parametrize(
    ("flags", "mnk"),
    [
        # A (4096, 2048), B (1024, 2048) taken transposed: M 4096, N 1024, K 2048
        (["False", "True", "False"], (4096, 1024, 2048)),
        # trans_c: Cᵀ = Bᵀ·Aᵀ, B (1024, 2048) first, not transposed, then A transposed: M 1024, N 4096
        (["False", "True", "True"], (1024, 4096, 2048)),
    ],
)
def test_hipblaslt_fp8_gemm_reads_its_transposes(flags, mnk):
    from magpie.traces.perf_models import estimate

    dims = [[4096, 2048], [], [1024, 2048], [], [], [], [], [], []]
    types = [FP8, "float", FP8, "float", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    found = estimate(_op("primus_turbo::hipblaslt_gemm_fp8", dims, types, ["", "", "", "", "15", *flags, "0"]))
    assert found is not None and found.family == "GEMM"
    assert (found.params["M"], found.params["N"], found.params["K"]) == mnk
    assert found.flops == 2 * 4096 * 1024 * 2048  # 17,179,869,184
    # A 4096·2048·1 = 8,388,608 B, B 2048·1024·1 = 2,097,152 B, the output 4096·1024·2 = 8,388,608 B
    assert found.bytes == 8_388_608 + 2_097_152 + 8_388_608
    assert found.params["dtype_A_B"] == (FP8, FP8) and found.params["dtype_scaleA"] == "float"


@pytest.mark.parametrize(
    ("name", "dims", "types", "flops", "moved"),
    [
        # X (64, 4096), W (1024, 4096), bf16: 2·64·1024·4096 = 536,870,912; X 524,288 B, W 8,388,608 B,
        # the output 64·1024·2 = 131,072 B
        ("aiter::gemm_a16w16", [[64, 4096], [1024, 4096], [], []], [BF16, BF16, "", "Scalar"], 536_870_912, 9_043_968),
        # with a bias: + 64·1024 FLOPs, + 1024·2 B read
        (
            "aiter::gemm_a16w16",
            [[64, 4096], [1024, 4096], [1024], []],
            [BF16, BF16, BF16, "Scalar"],
            536_870_912 + 65_536,
            9_043_968 + 2_048,
        ),
        # the atomic variant's output y (recorded at 3) in fp32: 64·1024·4 = 262,144 B
        (
            "aiter::gemm_a16w16_atomic_",
            [[64, 4096], [1024, 4096], [], [64, 1024]],
            [BF16, BF16, "", "float"],
            536_870_912,
            524_288 + 8_388_608 + 262_144,
        ),
        # the asm variant's output at 2; its split-K workspace at 3 not counted
        (
            "aiter::_gemm_a16w16_asm",
            [[64, 4096], [1024, 4096], [64, 1024], [8]],
            [BF16, BF16, BF16, "unsigned int"],
            536_870_912,
            9_043_968,
        ),
        # vLLM's unquantized GEMM with no bias: the output as the weight
        ("vllm::rocm_unquantized_gemm", [[64, 4096], [1024, 4096], []], [BF16, BF16, ""], 536_870_912, 9_043_968),
    ],
)
def test_a16w16_gemms_read_each_entry_points_output_and_bias(name, dims, types, flops, moved):
    from magpie.traces.perf_models import estimate

    found = estimate(_op(name, dims, types, [""] * len(dims)))
    assert found is not None and found.family == "GEMM"
    assert (found.params["M"], found.params["N"], found.params["K"]) == (64, 1024, 4096)
    assert (found.flops, found.bytes) == (flops, moved)


@pytest.mark.parametrize(
    ("name", "dims", "types"),
    [
        ("aiter::rms_norm", [[4, 7168], [7168], [], []], [BF16, BF16, "Scalar", "Scalar"]),
        ("aiter::rmsnorm2d_fwd_ck", [[4, 7168], [7168], [], []], [BF16, BF16, "Scalar", "Scalar"]),
        # rmsnorm(out, input, weight, epsilon)
        ("aiter::rmsnorm", [[4, 7168], [4, 7168], [7168], []], [BF16, BF16, BF16, "Scalar"]),
    ],
)
def test_aiter_rms_norms_count_as_an_affine_rms_norm(name, dims, types):
    from magpie.traces.perf_models import estimate

    found = estimate(_op(name, dims, types, [""] * len(dims)))
    assert found is not None and found.family == "normalization"
    # 4 rows of 7168: 4·(2·7168 + 2) for the roots = 57,352, one scale and one weight multiply per element 57,344
    assert found.flops == 57_352 + 57_344
    # the input read and the output written, 2 · 28,672 · 2 B, the weight 7168 · 2 B
    assert found.bytes == 114_688 + 14_336
    assert (found.params["num_channels"], found.params["is_affine"]) == (7168, True)


def test_vendor_ops_in_a_trace_fill_their_family_sheets(tmp_path):
    """A trace's blockscale GEMM and packed attention land on TraceLens's GEMM and SDPA_fwd sheets with
    their models' numbers and parameters."""
    import json

    from magpie.traces.ingest import load_trace
    from magpie.traces.perf_rows import trace_tables

    calls = [
        (
            "aiter::gemm_a8w8_blockscale_ck",
            [[256, 7168], [2048, 7168], [256, 56], [16, 56]],
            [FP8, FP8, "float", "float"],
            ["", "", "", ""],
        ),
        (
            "flash_attn::_flash_attn_varlen_forward",
            [Q, KV, KV, CU_SEQLENS, CU_SEQLENS, [], [], [], [], []],
            [BF16, BF16, BF16, INT, INT, "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
            ["", "", "", "", "", "600", "600", "0.", "0.125", "False"],
        ),
    ]
    events = []
    for i, (name, dims, types, concrete) in enumerate(calls):
        start = 100 * i
        args = {"Input Dims": dims, "Input type": types, "Input Strides": [[]] * len(dims), "Concrete Inputs": concrete}
        events += [
            {"ph": "X", "cat": "cpu_op", "name": name, "ts": start, "dur": 10, "pid": 1, "tid": 1, "args": args},
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": start + 1,
                "dur": 2,
                "pid": 1,
                "tid": 1,
                "args": {"correlation": i + 1},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"kernel_{i}",
                "ts": start + 5,
                "dur": 4,
                "pid": 0,
                "tid": 7,
                "args": {"correlation": i + 1},
            },
        ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    _, tables = trace_tables(load_trace(path))
    (gemm,) = tables["GEMM"]
    assert gemm["name"] == "aiter::gemm_a8w8_blockscale_ck" and gemm["GFLOPS_first"] == 2 * 256 * 2048 * 7168 / 1e9
    (attention,) = tables["SDPA_fwd"]
    assert attention["name"] == "flash_attn::_flash_attn_varlen_forward"
    assert attention["GFLOPS_first"] == 901_120_000 / 1e9


@pytest.mark.parametrize("name", ["aiter::rmsnorm2d_fwd_with_add_ck", "aiter::add_rmsnorm"])
def test_aiter_add_rms_norms_add_the_residual_first(name):
    from magpie.traces.perf_models import estimate

    # (out, input, residual_in, residual_out, weight, epsilon, ...): 4 rows of 7168, bf16
    rows = [4, 7168]
    found = estimate(_op(name, [rows] * 4 + [[7168], [], []], [BF16] * 5 + ["Scalar"] * 2, [""] * 7))
    assert found is not None and found.family == "normalization"
    # the residual add, 28,672, then the RMS norm's 57,352 + 57,344
    assert found.flops == 28_672 + 57_352 + 57_344
    # input and residual read, out and residual_out written: 4 · 28,672 · 2 B; the weight 7168 · 2 B
    assert found.bytes == 229_376 + 14_336
