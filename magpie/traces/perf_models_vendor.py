"""FLOPs and bytes of the non-ATen ops TraceLens models: attention libraries' and vendors' entry points.

Each model reads the inputs TraceLens's model of the op reads (TraceLens 171dd747) and counts with
magpie's own conventions where the two differ on purpose (causal pairs: `perf_models.causal_pairs`).

Packed ("varlen") attention records only the packed token counts, the number of sequences (from
`cu_seqlens`'s length) and the longest sequence, not each length: the estimate is the longest
sequence plus the others at the mean of what remains, as TraceLens assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from magpie.traces.perf_models import (
    DTYPE_BYTES,
    REGISTRY,
    TENSOR_PRECISION,
    Estimate,
    _probability,
    _stride,
    _types,
    _vector_precision,
    causal_pairs,
    concrete,
    rms_norm_counts,
    tensors,
)


@dataclass(frozen=True)
class VarlenLayout:
    """Where a packed-attention op records q (k, v follow), cu_seqlens_q (cu_seqlens_k follows),
    max_seqlen_q (max_seqlen_k follows), dropout_p and causal."""

    q: int
    cu_seqlens: int
    max_seqlen: int
    dropout: int
    causal: int
    backward: bool


# flash-attn's (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
# causal, ...) and its backward (dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, ...)
FLASH_VARLEN = {
    "flash_attn::_flash_attn_varlen_forward": VarlenLayout(0, 3, 5, 7, 9, backward=False),
    "flash_attn::_flash_attn_varlen_backward": VarlenLayout(1, 9, 11, 13, 15, backward=True),
}


def _sequence_flops(lq: int, lk: int, h: int, hk: int, d: int, dv: int, causal: bool, backward: bool) -> float:
    """One sequence's attention FLOPs: forward QK^T and PV (2·pairs·(d + d_v) per head); backward the
    scores recomputed and the V, P, Q and K gradients (2·pairs·(3·d + 2·d_v)) plus the grouped heads'
    K and V gradients summed into each KV head."""
    pairs = causal_pairs(lq, lk) if causal else lq * lk
    if not backward:
        return 2.0 * h * pairs * (d + dv)
    return 2.0 * h * pairs * (3 * d + 2 * dv) + lk * (d + dv) * (h // hk - 1)


def flash_varlen(op) -> Estimate | None:
    layout = FLASH_VARLEN[op.name]
    inputs = tensors(op)
    q, k, v = (inputs[layout.q : layout.q + 3] + [None, None, None])[:3]
    cu_q, cu_k = (inputs[layout.cu_seqlens : layout.cu_seqlens + 2] + [None, None])[:2]
    if not (q and k and v and cu_q and cu_k and len(q.shape) == 3 and len(k.shape) == 3 and len(v.shape) == 3):
        return None
    (tq, h, d), (tk, hk, _), dv = q.shape, k.shape, v.shape[2]
    seqs_q, seqs_k = cu_q.shape[0] - 1, cu_k.shape[0] - 1
    max_q = int(float(concrete(op, layout.max_seqlen)))
    max_k = int(float(concrete(op, layout.max_seqlen + 1)))
    causal = concrete(op, layout.causal) in ("True", "1")
    flops = _sequence_flops(max_q, max_k, h, hk, d, dv, causal, layout.backward)
    if seqs_q > 1:
        rest_q, rest_k = (tq - max_q) // (seqs_q - 1), (tk - max_k) // (seqs_k - 1)
        flops += (seqs_q - 1) * _sequence_flops(rest_q, rest_k, h, hk, d, dv, causal, layout.backward)
    out_bytes = tq * h * dv * DTYPE_BYTES.get(q.dtype, 2)
    operands = q.nbytes + k.nbytes + v.nbytes
    # backward reads q, k, v and the output's gradient and writes q's, k's and v's gradients
    moved = 2 * operands + out_bytes if layout.backward else operands + out_bytes
    return Estimate(
        "SDPA",
        flops,
        moved,
        TENSOR_PRECISION.get(q.dtype, "fp32"),
        {
            "B": 1,
            "N_Q": tq,
            "H_Q": h,
            "N_KV": tk,
            "H_KV": hk,
            "d_h_qk": d,
            "d_h_v": dv,
            **{f"{name}_stride": _stride(op, layout.q + i) for i, name in enumerate("qkv")},
            "dropout": _probability(concrete(op, layout.dropout)),
            "causal": causal,
            "flash_impl": True,
            "dtype_A_B": _types(op, 0, 2),
            "num_seqs_q": seqs_q,
            "num_seqs_kv": seqs_k,
            "max_seqlen_q": float(max_q),
            "max_seqlen_kv": float(max_k),
        },
    )


@dataclass(frozen=True)
class DenseLayout:
    """Where an unpadded (B, L, H, d) attention op records q (k, v follow), dropout_p (None: never
    applied) and causal."""

    q: int
    dropout: int | None
    causal: int
    backward: bool


# AITER's flash-attention entry points and flash-attn 3's forward. TraceLens gives their rows no
# strides and no dtypes among the parameters, and reads "true" in any case as causal.
DENSE = {
    "aiter::_flash_attn_forward": DenseLayout(0, 3, 5, backward=False),
    "aiter::_flash_attn_backward": DenseLayout(0, 10, 12, backward=True),
    "aiter::wrapper_fmha_v3_fwd": DenseLayout(1, 4, 6, backward=False),
    "aiter::wrapper_fmha_v3_bwd": DenseLayout(1, 7, 9, backward=True),
    "flash_attn_3::fwd": DenseLayout(0, None, 24, backward=False),
}


def dense_attention(op) -> Estimate | None:
    layout = DENSE[op.name]
    q, k, v = (tensors(op)[layout.q : layout.q + 3] + [None, None, None])[:3]
    if not (q and k and v and len(q.shape) == 4 and len(k.shape) == 4 and len(v.shape) == 4):
        return None
    (b, lq, h, d), (_, lk, hk, _), dv = q.shape, k.shape, v.shape[3]
    causal = concrete(op, layout.causal).lower() == "true"
    flops = b * _sequence_flops(lq, lk, h, hk, d, dv, causal, layout.backward)
    out_bytes = b * lq * h * dv * DTYPE_BYTES.get(q.dtype, 2)
    operands = q.nbytes + k.nbytes + v.nbytes
    moved = 2 * operands + out_bytes if layout.backward else operands + out_bytes
    dropout = _probability(concrete(op, layout.dropout)) if layout.dropout is not None else 0.0
    return Estimate(
        "SDPA",
        flops,
        moved,
        TENSOR_PRECISION.get(q.dtype, "fp32"),
        {
            "B": b,
            "N_Q": lq,
            "H_Q": h,
            "N_KV": lk,
            "H_KV": hk,
            "d_h_qk": d,
            "d_h_v": dv,
            "dropout": dropout,
            "causal": causal,
            "flash_impl": True,
        },
    )


# -- vendor GEMMs ----------------------------------------------------------------------------
# Entry points that take X (M, K) and W (N, K) quantized with per-block scales (inputs 2 and 3, when
# recorded) and write a bf16 Y (M, N), as TraceLens models AITER's gemm_a8w8_blockscale for all of them.
A8W8_BLOCKSCALE = (
    "aiter::_gemm_a8w8_blockscale_bpreshuffle_asm",
    "aiter::flatmm_a8w8_blockscale_asm",
    "aiter::gemm_a8w8_blockscale_bpreshuffle_ck",
    "aiter::gemm_a8w8_blockscale_bpreshuffle_cktile",
    "aiter::gemm_a8w8_blockscale_ck",
    "aiter::gemm_a8w8_blockscale_cktile",
    "aiter::gemm_a8w8_bpreshuffle",
    "aiter::gemm_a8w8_bpreshuffle_ck",
    "aiter::gemm_a8w8_ck",
    "aiter::gfx950_a8w8_blockscale_asm",
    "sglang_profiler::fp8_utils_gemm_a8w8_blockscale",
    "sglang_profiler::gemm_a8w8_blockscale_gemm_a8w8_blockscale",
    "vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm",
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale",
)
BLOCKSCALE_OUTPUT = "c10::BFloat16"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gemm_a8w8_blockscale(op) -> Estimate | None:
    """2·M·N·K, the per-block rescaling left out (K/block times fewer); X, W and Y moved once, the
    scales not counted (TraceLens's choice: a 128-wide block makes them a fraction of a percent)."""
    x, w = (tensors(op) + [None, None])[:2]
    if not (x and w and len(x.shape) == 2 and len(w.shape) == 2):
        return None
    (m, k), n = x.shape, w.shape[0]
    moved = x.nbytes + w.nbytes + m * n * DTYPE_BYTES[BLOCKSCALE_OUTPUT]
    params: dict = {"B": 1, "M": m, "N": n, "K": k, "bias": False, "dtype_A_B": (x.dtype, w.dtype, "c10::bfloat16")}
    dims = op.input_dims or []
    if len(dims) > 3:
        x_scale, w_scale = dims[2], dims[3]
        params.update(
            quant_scheme="a8w8_blockscale",
            quant_granularity="per_block",
            block_k=_ceil_div(k, x_scale[-1]) if x_scale and x_scale[-1] else None,
            block_n=_ceil_div(n, w_scale[0]) if w_scale and w_scale[0] else None,
            scale_dtype=(op.input_types or [])[2] if len(op.input_types or []) > 2 else "float32",
        )
    params.update(output_shape=(m, n), output_dtype="c10::bfloat16")
    return Estimate("GEMM", 2.0 * m * n * k, moved, TENSOR_PRECISION.get(x.dtype, "fp8_tensor"), params)


# -- gated activations --------------------------------------------------------------------------
# act_and_mul(out (..., I), input (..., 2·I)): act(gate) · up per output element, at TraceLens's
# FLOPs per element for each activation (SiLU 5, erf GELU 8, tanh GELU 10).
GATED_ACTIVATIONS = {
    "aiter::silu_and_mul": 5,
    "_C::silu_and_mul": 5,
    "sgl_kernel::silu_and_mul": 5,
    "aiter::gelu_and_mul": 8,
    "aiter::gelu_tanh_and_mul": 10,
}


def gated_activation(op) -> Estimate | None:
    """The gate and up halves read, the output written once."""
    out, gate_up = (tensors(op) + [None, None])[:2]
    if not (out and gate_up):
        return None
    numel = out.numel
    moved = 2 * numel * DTYPE_BYTES[gate_up.dtype] + out.nbytes
    params = {
        "op_shape": tuple(out.shape),
        "dtype_in_out": (gate_up.dtype, out.dtype),
        "stride_input": _stride(op, 1),
        "stride_output": _stride(op, 0),
    }
    flops = float(GATED_ACTIVATIONS[op.name] * numel)
    return Estimate("elementwise", flops, moved, _vector_precision(gate_up.dtype), params)


# hipblaslt_gemm_fp8(A, scale_a_inv, B, scale_b_inv, out_dtype, trans_a, trans_b, trans_c, granularity)
HIPBLASLT_FP8 = ("primus_turbo::hipblaslt_gemm_fp8", "primus_turbo_cpp_extension::hipblaslt_gemm_fp8")


def _set(text: str) -> bool:
    """A recorded bool argument, read as TraceLens reads one: anything but false, 0 or nothing is set."""
    return text.strip().lower() not in ("false", "0", "")


def hipblaslt_gemm_fp8(op) -> Estimate | None:
    """2·M·N·K; A and B moved once at their own widths, the output at 2 bytes from 1-byte operands
    (else at A's width); the inverse scales not counted. trans_c computes Cᵀ = Bᵀ·Aᵀ: the operands
    swap and their transposes flip."""
    inputs = tensors(op)
    a, b = (inputs[0:1] + [None])[0], (inputs[2:3] + [None])[0]
    if not (a and b and len(a.shape) == 2 and len(b.shape) == 2):
        return None
    trans_a, trans_b = _set(concrete(op, 5)), _set(concrete(op, 6))
    first, second = (a, b)
    if _set(concrete(op, 7)):
        first, second, trans_a, trans_b = b, a, not trans_b, not trans_a
    m, k = (first.shape[1], first.shape[0]) if trans_a else (first.shape[0], first.shape[1])
    n = second.shape[0] if trans_b else second.shape[1]
    width_a, width_b = DTYPE_BYTES[first.dtype], DTYPE_BYTES[second.dtype]
    out_width = 2 if width_a == 1 else width_a
    moved = m * k * width_a + k * n * width_b + m * n * out_width
    types = op.input_types or []
    params = {
        "M": m,
        "N": n,
        "K": k,
        "bias": False,
        "stride_A": _stride(op, 0),
        "stride_B": _stride(op, 2),
        "dtype_A_B": (types[0], types[2]),
        "dtype_scaleA": types[1] if len(types) > 1 else None,
        "dtype_scaleB": types[3] if len(types) > 3 else None,
        "B": 1,
    }
    return Estimate("GEMM", 2.0 * m * n * k, moved, TENSOR_PRECISION.get(a.dtype, "fp8_tensor"), params)


# X (M, K) · W (N, K)ᵀ in 16 bits, each entry point with its own record of the output's dtype and
# of a bias: (where the bias is, or None; how the output dtype is found; whether "B" leads the parameters).
A16W16 = {
    # (x, w, bias, dtype, ...): the output as x
    "aiter::gemm_a16w16": (2, "x", True),
    # (x, w, y, ...) with a split-K workspace at 3 (the triton variant records y at 3, bf16 by default)
    "aiter::gemm_a16w16_atomic_": (None, "at 3", True),
    "sglang_profiler::gemm_kernels_flydsl_hgemm": (None, "at 3", True),
    "aiter::_gemm_a16w16_asm": (None, "at 2 if known", True),
    # (x, weight, bias): the output as the bias where there is one, else as the weight
    "vllm::rocm_unquantized_gemm": (2, "as bias", False),
}
_WIDTHS = {name.lower(): width for name, width in DTYPE_BYTES.items()}


def _width(dtype: str) -> int | None:
    return _WIDTHS.get(dtype.lower())


def gemm_a16w16(op) -> Estimate | None:
    """2·M·N·K (+ M·N for a bias); X, W, the output and the bias moved once. The dtypes are TraceLens's
    reading of each entry point's arguments; one of unknown width leaves the op without an estimate."""
    bias_at, output_rule, batch_first = A16W16[op.name]
    dims, types = op.input_dims or [], list(op.input_types or [])
    x, w = (tensors(op) + [None, None])[:2]
    if not (x and w and len(x.shape) == 2 and len(w.shape) == 2):
        return None
    (m, k), n = x.shape, w.shape[0]
    bias = bias_at is not None and len(dims) > bias_at and bool(dims[bias_at])
    if output_rule == "x":
        third = types[0]
    elif output_rule == "at 3":
        third = types[3] if len(types) > 3 else "c10::bfloat16"
    elif output_rule == "at 2 if known":
        third = types[2] if len(types) > 2 and _width(types[2]) else types[0]
    else:
        third = types[2] if len(types) > 2 else ""
    out_dtype = third if output_rule != "as bias" or bias else types[1]
    widths = (_width(types[0]), _width(types[1]), _width(out_dtype))
    if None in widths:
        return None
    width_x, width_w, width_out = widths
    moved = m * k * width_x + n * k * width_w + m * n * width_out + (n * width_out if bias else 0)
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    shape = {"B": 1, "M": m, "N": n, "K": k} if batch_first else {"M": m, "N": n, "K": k}
    params = {**shape, "bias": bias, "dtype_A_B": (types[0], types[1], third)}
    params.setdefault("B", 1)
    return Estimate("GEMM", flops, moved, TENSOR_PRECISION.get(x.dtype, "fp32"), params)


# -- RMS norms ----------------------------------------------------------------------------------
# AITER's RMS norms, always with a weight: where the input and the weight are, and whether a residual is
# added first (out, input, residual_in, residual_out, weight, epsilon...).
AITER_RMS_NORM = {
    "aiter::rms_norm": (0, 1, False),
    "aiter::rmsnorm2d_fwd_ck": (0, 1, False),
    "aiter::rmsnorm": (1, 2, False),
    "aiter::rmsnorm2d_fwd_with_add_ck": (1, 4, True),
    "aiter::add_rmsnorm": (1, 4, True),
}


def aiter_rms_norm(op) -> Estimate | None:
    """ATen's RMS norm count (`rms_norm_counts`, affine) over rows as long as the weight; a fused
    residual add is one more FLOP per element, the residual read and the sum written too."""
    input_at, weight_at, with_add = AITER_RMS_NORM[op.name]
    inputs = tensors(op)
    x, weight = (inputs[input_at : input_at + 1] + [None])[0], (inputs[weight_at : weight_at + 1] + [None])[0]
    if not (x and weight and weight.shape):
        return None
    channels = weight.shape[0]
    flops, values = rms_norm_counts(x.numel, channels, True, [], False)
    if with_add:
        flops, values = flops + x.numel, values + 2 * x.numel
    params = {
        "op_shape": tuple(x.shape),
        "dtype_in_out": (x.dtype, None),
        "stride_input": _stride(op, input_at),
        "stride_output": None,
        "num_channels": channels,
        "has_bias": False,
        "is_affine": True,
        "is_training": False,
    }
    return Estimate("normalization", float(flops), values * DTYPE_BYTES[x.dtype], _vector_precision(x.dtype), params)


REGISTRY.update({name: flash_varlen for name in FLASH_VARLEN})
REGISTRY.update({name: aiter_rms_norm for name in AITER_RMS_NORM})
REGISTRY.update({name: gemm_a16w16 for name in A16W16})
REGISTRY.update({name: hipblaslt_gemm_fp8 for name in HIPBLASLT_FP8})
REGISTRY.update({name: gated_activation for name in GATED_ACTIVATIONS})
REGISTRY.update({name: gemm_a8w8_blockscale for name in A8W8_BLOCKSCALE})
REGISTRY.update({name: dense_attention for name in DENSE})
