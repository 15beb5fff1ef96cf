"""FLOPs and bytes of an op from its recorded input shapes and types.

Small families of generic models (a GEMM is 2·M·N·K, an elementwise op moves every tensor
once, a reduction reads its input and writes what is left after the reduced dims) and one
registry from aten op names to families (GEMM, attention, convolution, elementwise,
reduction, normalization, softmax, indexing, copy, foreach). An op with no model returns None and is reported
as such (`has_perf_model: False`), never guessed. Each estimate's `params` are the model's
parameters as TraceLens names them (M, N, K, bias, stride_A, dtype_A_B...; op_shape,
dtype_in_out...), in its order: they are the `param:` columns of the family sheets and the
unified table's `perf_params`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from magpie.traces import tracelens_ops

DTYPE_BYTES = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::complex<float>": 8,
}
# The roofline peak an op's arithmetic is held against, by its (first) operand dtype.
TENSOR_PRECISION = {
    "c10::BFloat16": "bf16_tensor",
    "c10::Half": "fp16_tensor",
    "float": "tf32_tensor",
    "double": "fp64_tensor",
    "c10::Float8_e4m3fn": "fp8_tensor",
    "c10::Float8_e5m2": "fp8_tensor",
    "signed char": "int8_tensor",
}
VECTOR_PRECISION = {"double": "fp64"}


@dataclass
class Estimate:
    family: str
    flops: float
    bytes: float
    precision: str
    params: dict = field(default_factory=dict)


@dataclass
class Tensor:
    shape: list[int]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)


def _tensor(dims, dtype) -> Tensor | None:
    if isinstance(dims, list) and dtype in DTYPE_BYTES and all(isinstance(d, int) for d in dims):
        return Tensor(dims, dtype)
    return None


def tensors(op) -> list[Tensor | None]:
    """Positional inputs as tensors (None for scalars and the like); tensor lists flattened
    under a 'TensorList' type are returned by tensor_list()."""
    dims, types = op.input_dims or [], op.input_types or []
    return [_tensor(d, t) for d, t in zip(dims, types)]


def tensor_list(op, index: int = 0) -> list[Tensor]:
    dims = (op.input_dims or [])[index] if len(op.input_dims or []) > index else []
    dtype = next((t for t in (op.input_types or []) if t in DTYPE_BYTES), "float")
    return [Tensor(d, dtype) for d in dims if isinstance(d, list) and all(isinstance(x, int) for x in d)]


def concrete(op, index: int, default: str = "") -> str:
    values = op.concrete or []
    return str(values[index]) if index < len(values) else default


def _stride(op, index: int) -> tuple | None:
    """An input's recorded strides as a tuple (None where the trace has no Input Strides)."""
    strides = op.strides
    if strides is None or index >= len(strides) or not isinstance(strides[index], list):
        return None
    return tuple(strides[index])


def _types(op, start: int, stop: int) -> tuple:
    return tuple((op.input_types or [])[start:stop])


def _recorded(op, index: int) -> bool:
    """Whether a positional input is a tensor the trace recorded dims for (an absent optional
    tensor and a scalar record [])."""
    dims = op.input_dims or []
    return index < len(dims) and bool(dims[index])


def _vector_precision(dtype: str) -> str:
    return VECTOR_PRECISION.get(dtype, "fp32")


# -- GEMM ---------------------------------------------------------------------------------
def _gemm(
    op, m: int, n: int, k: int, batch: int, a: Tensor, b: Tensor, out_dtype: str, extra: list[Tensor], a_index: int = 0
) -> Estimate:
    """A (batched) GEMM whose A and B are inputs a_index and a_index + 1; `extra` are the other
    operands it reads (bias, scales)."""
    out_bytes = batch * m * n * DTYPE_BYTES.get(out_dtype, 4)
    flops = 2.0 * batch * m * n * k
    moved = a.nbytes + b.nbytes + out_bytes + sum(t.nbytes for t in extra)
    # TraceLens's names and order: B leads for batched GEMMs and follows dtype_A_B otherwise
    batched = len(a.shape) == 3 and len(b.shape) == 3
    shape = {"B": batch, "M": m, "N": n, "K": k} if batched else {"M": m, "N": n, "K": k}
    params = {
        **shape,
        "bias": bool(extra),
        "stride_A": _stride(op, a_index),
        "stride_B": _stride(op, a_index + 1),
        "dtype_A_B": _types(op, a_index, a_index + 2),
    }
    params.setdefault("B", batch)
    return Estimate("GEMM", flops, moved, TENSOR_PRECISION.get(a.dtype, "fp32"), params)


def mm(op):
    a, b = tensors(op)[:2]
    if a and b and len(a.shape) == 2 and len(b.shape) == 2:
        return _gemm(op, a.shape[0], b.shape[1], a.shape[1], 1, a, b, a.dtype, [])
    return None


def addmm(op):
    t = tensors(op)
    bias, a, b = (t + [None, None, None])[:3]
    if a and b and len(a.shape) == 2 and len(b.shape) == 2:
        est = _gemm(op, a.shape[0], b.shape[1], a.shape[1], 1, a, b, a.dtype, [bias] if bias else [], a_index=1)
        est.flops += a.shape[0] * b.shape[1]
        return est
    return None


def bmm(op):
    a, b = tensors(op)[:2]
    if a and b and len(a.shape) == 3 and len(b.shape) == 3:
        return _gemm(op, a.shape[1], b.shape[2], a.shape[2], a.shape[0], a, b, a.dtype, [])
    return None


def baddbmm(op):
    t = tensors(op)
    bias, a, b = (t + [None, None, None])[:3]
    if a and b and len(a.shape) == 3 and len(b.shape) == 3:
        return _gemm(
            op, a.shape[1], b.shape[2], a.shape[2], a.shape[0], a, b, a.dtype, [bias] if bias else [], a_index=1
        )
    return None


def linear(op):
    t = tensors(op)
    x, w = t[0], t[1] if len(t) > 1 else None
    bias = t[2] if len(t) > 2 else None
    if x and w and len(w.shape) == 2:
        m = math.prod(x.shape[:-1])
        return _gemm(op, m, w.shape[0], w.shape[1], 1, x, w, x.dtype, [bias] if bias else [])
    return None


# c10::ScalarType codes as the profiler records a dtype argument (out_dtype of _scaled_mm).
SCALAR_TYPES = {
    "5": "c10::Half",
    "6": "float",
    "7": "double",
    "15": "c10::BFloat16",
    "23": "c10::Float8_e5m2",
    "24": "c10::Float8_e4m3fn",
}


def scaled_mm(op):
    """_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum): the
    scales (0-d, row- or column-wise) and the bias are read too; the output has out_dtype."""
    t = tensors(op)
    a, b = (t + [None, None])[:2]
    if a and b and len(a.shape) == 2 and len(b.shape) == 2:
        out_dtype = SCALAR_TYPES.get(concrete(op, 6), a.dtype)
        extra = [x for x in t[2:5] if x]
        est = _gemm(op, a.shape[0], b.shape[1], a.shape[1], 1, a, b, out_dtype, extra)
        est.precision = TENSOR_PRECISION.get(a.dtype, "fp8_tensor")
        est.params["bias"] = _recorded(op, 4)  # the scales are read too, but only input 4 is a bias
        return est
    return None


# -- convolution ----------------------------------------------------------------------------
# Where each convolution op records (stride, padding, dilation, transposed, output_padding, groups);
# transposed is an argument index, or True for the ops that are transposed by name. Checked
# against the argument lists of an H200 trace (tests/fixtures/traces/h200/conv_bf16.json.gz).
CONVOLUTION = {
    "aten::convolution": (3, 4, 5, 6, 7, 8),
    "aten::_convolution": (3, 4, 5, 6, 7, 8),
    "aten::cudnn_convolution": (3, 2, 4, None, None, 5),
    "aten::cudnn_convolution_transpose": (4, 2, 5, True, 3, 6),
    "aten::miopen_convolution": (4, 3, 5, None, None, 6),
    "aten::miopen_convolution_transpose": (5, 3, 6, True, 4, 7),
}


def _int_list(text: str, rank: int, default: int) -> list[int]:
    values = [int(v) for v in text.strip("[]() ").split(",") if v.strip()] if text else []
    if not values:
        return [default] * rank
    return values * rank if len(values) == 1 else values


def convolution(op):
    return _convolution(op, CONVOLUTION[op.name], 0)


# convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
# output_padding, groups, output_mask)
_CONVOLUTION_BACKWARD = (4, 5, 6, 7, 8, 9)


def convolution_backward(op):
    """The input's and the weight's gradients, each as many multiply-adds as the forward
    convolution, and the bias's (one add per output element) where the forward had a bias: each
    gradient reads the output's gradient and the other operand and writes its own."""
    return _convolution(op, _CONVOLUTION_BACKWARD, 1)


def _convolution(op, where: tuple, first: int):
    stride_i, pad_i, dil_i, transposed_i, outpad_i, groups_i = where
    t = tensors(op)
    x, w = (t[first : first + 2] + [None, None])[:2]
    if not (x and w) or len(x.shape) < 3 or len(w.shape) != len(x.shape):
        return None
    rank = len(x.shape) - 2
    stride = _int_list(concrete(op, stride_i), rank, 1)
    padding = _int_list(concrete(op, pad_i), rank, 0)
    dilation = _int_list(concrete(op, dil_i), rank, 1)
    transposed = transposed_i is True or (transposed_i is not None and concrete(op, transposed_i) in ("True", "1"))
    output_padding = _int_list(concrete(op, outpad_i), rank, 0) if outpad_i is not None else [0] * rank
    groups = int(concrete(op, groups_i, "1") or 1)
    n, c_in, spatial, kernel = x.shape[0], x.shape[1], x.shape[2:], w.shape[2:]
    if transposed:
        c_out = w.shape[1] * groups
        out = [
            (i - 1) * s - 2 * p + d * (k - 1) + op_ + 1
            for i, s, p, d, k, op_ in zip(spatial, stride, padding, dilation, kernel, output_padding)
        ]
        flops = 2.0 * n * c_in * math.prod(spatial) * (c_out // groups) * math.prod(kernel)
    else:
        c_out = w.shape[0]
        out = [
            (i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(spatial, stride, padding, dilation, kernel)
        ]
        flops = 2.0 * n * c_out * math.prod(out) * (c_in // groups) * math.prod(kernel)
    size = DTYPE_BYTES.get(x.dtype, 4)
    out_numel = n * c_out * math.prod(out)
    if first == 0:
        bias = t[2] if len(t) > 2 and t[2] else None
        has_bias = bias is not None
        moved = x.nbytes + w.nbytes + out_numel * size + (bias.nbytes if bias else 0)
    else:
        has_bias = concrete(op, 3) not in ("", "None", "[]")  # bias_sizes: the forward's bias, if it had one
        flops = 2 * flops + (out_numel if has_bias else 0)
        moved = 2 * (out_numel * size + x.nbytes + w.nbytes) + ((out_numel + c_out) * size if has_bias else 0)
    return Estimate(
        "CONV",
        flops,
        moved,
        TENSOR_PRECISION.get(x.dtype, "fp32"),
        {
            "convNd": f"conv{rank}d",
            "input_shape": tuple(x.shape),
            "filter_shape": tuple(w.shape),
            "dtype_input_weight": _types(op, first, first + 2),
            "input_stride": _stride(op, first),
            "weight_stride": _stride(op, first + 1),
            "bias": has_bias,
            "stride": tuple(stride),
            "padding": tuple(padding),
            "dilation": tuple(dilation),
            "transposed_conv": transposed,
            "output_padding": tuple(output_padding),
            "groups": groups,
        },
    )


# -- attention ------------------------------------------------------------------------------
# Where each attention op records is_causal and dropout_p among its concrete inputs, and its q/k/v layout.
ATTENTION = {
    "aten::scaled_dot_product_attention": (5, 4, "BHLD"),
    "aten::_scaled_dot_product_flash_attention": (4, 3, "BHLD"),
    "aten::_scaled_dot_product_efficient_attention": (6, 5, "BHLD"),
    "aten::_scaled_dot_product_cudnn_attention": (6, 5, "BHLD"),
    "aten::_cudnn_attention_forward": (10, 9, "BHLD"),
    "aten::_flash_attention_forward": (8, 7, "BLHD"),
    "aten::_efficient_attention_forward": (9, 8, "BLHD"),
    # flash-attn's (q, k, v, dropout_p, softmax_scale, causal, ...) and the autograd function around it
    "flash_attn::_flash_attn_forward": (5, 3, "BLHD"),
    "FlashAttnFunc": (5, 3, "BLHD"),
}
# flash-attn's backward (dout, q, k, v, ...): where q and its causal flag and dropout are, as TraceLens reads them
FLASH_BACKWARD = {"flash_attn::_flash_attn_backward": (1, 10, 8)}


def causal_pairs(lq: int, lk: int) -> int:
    """Query/key pairs under a causal mask aligned to the bottom right (query i sees the first
    lk - lq + i + 1 keys): decode steps (lq < lk) and prefill (lq == lk) alike."""
    if lq > lk:
        return lk * (lk + 1) // 2 + (lq - lk) * lk  # rows past lk see every key
    return lq * (lk - lq) + lq * (lq + 1) // 2


def attention(op):
    causal_index, dropout_index, layout = ATTENTION[op.name]
    q, k, v = (tensors(op) + [None, None, None])[:3]
    if not (q and k and v and len(q.shape) == 4 and len(k.shape) == 4):
        return None
    if layout == "BHLD":
        (b, h, lq, d), (_, hk, lk, _), dv = q.shape, k.shape, v.shape[3]
    else:
        (b, lq, h, d), (_, lk, hk, _), dv = q.shape, k.shape, v.shape[3]
    flag = concrete(op, causal_index)
    is_causal = flag in ("True", "1") if op.name != "aten::_efficient_attention_forward" else flag == "1"
    pairs = causal_pairs(lq, lk) if is_causal else lq * lk
    flops = 2.0 * b * h * pairs * (d + dv)
    out_bytes = b * h * lq * dv * DTYPE_BYTES.get(q.dtype, 2)
    moved = q.nbytes + k.nbytes + v.nbytes + out_bytes
    strides = (
        {f"{name}_stride": _stride(op, i) for i, name in enumerate("qkv")}
        if layout == "BLHD" and not op.name.startswith("aten::")
        else {}
    )
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
            **strides,
            "dropout": _probability(concrete(op, dropout_index)),
            "causal": is_causal,
            "flash_impl": "flash" in op.name.lower(),
            "dtype_A_B": _types(op, 0, 2),
        },
    )


def attention_backward(op):
    """flash-attn's backward: the scores recomputed (2·pairs·d_qk), the gradients of V and of the
    probabilities (2·pairs·d_v each), of Q and of K (2·pairs·d_qk each), with causal pairs counted as
    the forward's; grouped-query heads' K and V gradients summed over each group; Q, K, V and the
    output's gradient read, the three gradients written."""
    at, causal_index, dropout_index = FLASH_BACKWARD[op.name]
    q, k, v = (tensors(op)[at : at + 3] + [None, None, None])[:3]
    if not (q and k and v and len(q.shape) == 4 and len(k.shape) == 4):
        return None
    (b, lq, h, d), (_, lk, hk, _), dv = q.shape, k.shape, v.shape[3]
    is_causal = concrete(op, causal_index, "True") in ("True", "1")
    pairs = causal_pairs(lq, lk) if is_causal else lq * lk
    group_sums = b * lk * (d + dv) * (h // hk - 1) if hk else 0
    flops = 2.0 * b * h * pairs * (3 * d + 2 * dv) + group_sums
    size = DTYPE_BYTES.get(q.dtype, 2)
    moved = 2 * (q.nbytes + k.nbytes + v.nbytes) + b * lq * h * dv * size
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
            **{f"{name}_stride": _stride(op, at + i) for i, name in enumerate("qkv")},
            "dropout": _probability(concrete(op, dropout_index)),
            "causal": is_causal,
            "flash_impl": True,
            "dtype_A_B": _types(op, 0, 2),
        },
    )


def _probability(text: str) -> float:
    """A recorded float argument ('0.', '0.1'); 0.0 where none was recorded."""
    try:
        return float(text)
    except ValueError:
        return 0.0


# -- memory-bound families ----------------------------------------------------------------
def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for shape in shapes:
        for i, d in enumerate(shape[::-1]):
            out[rank - 1 - i] = max(out[rank - 1 - i], d)
    return out


COPIES = ("aten::copy", "aten::copy_")
SCALAR_BYTES = 4


def elementwise(op):
    present = [t for t in tensors(op) if t]
    if not present:
        return None
    params = _elementwise_params(op)
    if op.name in COPIES:
        # copy_(dst, src): the source read, the destination written over (never read), one
        # conversion per element, as TraceLens counts it
        out = present[0]
        numel = out.numel
        moved = out.nbytes + (present[1].nbytes if len(present) > 1 else out.nbytes)
    elif op.name.endswith("_"):
        out = present[0]  # in place: the first operand is read and written
        moved = sum(t.nbytes for t in present) + out.nbytes
        numel = out.numel
    else:
        shape = _broadcast([t.shape for t in present])
        numel = math.prod(shape)
        moved = sum(t.nbytes for t in present) + numel * DTYPE_BYTES.get(present[0].dtype, 4)
    if op.name in BINARY_OPS:
        # TraceLens's counting rule: a Scalar operand (x / 2) is one 4-byte value read, like a 0-d tensor
        moved += SCALAR_BYTES * sum(t == "Scalar" for t in (op.input_types or [])[:2])
    flops = 0.0 if op.name in ("aten::fill_", "aten::_to_copy", "aten::clone") else float(numel)
    return Estimate("elementwise", flops, moved, _vector_precision(present[0].dtype), params)


def _elementwise_params(op) -> dict:
    """TraceLens's parameters of an elementwise op: a binary op's two operands (shape_in1,
    shape_in2...), otherwise the operand (op_shape...); an output is a third (second) input
    where one is recorded, as with out= variants."""
    dims = op.input_dims or []
    if op.name in COPIES:  # copy_(self, src): src is read, self written, one element per element of self
        return {
            "op_shape": tuple(dims[0]),
            "dtype_in_out": _types(op, 1, 2) + _types(op, 0, 1),
            "stride_input": _stride(op, 1),
            "stride_output": _stride(op, 0),
        }
    if op.name in BINARY_OPS or (op.name not in UNARY_OPS and sum(bool(d) for d in dims[:3]) >= 2):
        out = _recorded(op, 2)
        return {
            "shape_in1": tuple(dims[0]),
            "shape_in2": tuple(dims[1]) if len(dims) > 1 else (),
            "dtype_in1_in2_out": _types(op, 0, 2) + (_types(op, 2, 3) if out else (None,)),
            "stride_input1": _stride(op, 0),
            "stride_input2": _stride(op, 1),
            "stride_output": _stride(op, 2) if out else None,
        }
    out = _recorded(op, 1)
    return {
        "op_shape": tuple(dims[0]),
        "dtype_in_out": _types(op, 0, 1) + (_types(op, 1, 2) if out else (None,)),
        "stride_input": _stride(op, 0),
        "stride_output": _stride(op, 1) if out else None,
    }


def _dims(text: str, rank: int) -> list[int] | None:
    text = text.strip()
    if not text or text in ("None", ""):
        return list(range(rank))
    try:
        values = [int(v) for v in text.strip("[]").split(",") if v.strip()]
    except ValueError:
        return None
    return [v % rank for v in values] if values else list(range(rank))


# Where a reduction records its dims among the concrete inputs (after the tensor): norms name their order first
_REDUCED_DIMS_AT = {"aten::norm": 2, "aten::linalg_norm": 2, "aten::linalg_vector_norm": 2}
SCANS = ("aten::cumsum", "aten::cumprod")  # one output per input element, along one dim
_DTYPE_SECOND = ("aten::sum", "aten::mean")  # their overloads with one Scalar after the tensor take a dtype


def reduction(op):
    x = tensors(op)[0] if tensors(op) else None
    if x is None:
        return None
    index_out = op.name in ("aten::argmax", "aten::argmin")
    dims_text = concrete(op, _REDUCED_DIMS_AT.get(op.name, 1))
    if op.name in _DTYPE_SECOND and (op.input_types or [None, None])[1:2] == ["Scalar"]:
        dims_text = ""  # sum(x, dtype=...): the Scalar is a ScalarType code, not a dim; all dims reduce
    if op.name in SCANS:
        kept = x.numel
    else:
        reduced = (
            list(range(len(x.shape))) if index_out and dims_text in ("", "None") else _dims(dims_text, len(x.shape))
        )
        if reduced is None:
            return None
        kept = math.prod(d for i, d in enumerate(x.shape) if i not in reduced)
    out_dtype = "long int" if index_out else x.dtype
    moved = x.nbytes + kept * DTYPE_BYTES.get(out_dtype, 4)
    kind = next((k for k in ("mean", "max", "min", "norm") if k in op.name), "sum")
    # TraceLens's parameters: the output dtype None where it is the input's
    return Estimate(
        "reduction",
        float(x.numel),
        moved,
        _vector_precision(x.dtype),
        {
            "num_input_elems": x.numel,
            "num_output_elems": kept,
            "dtype_in_out": (x.dtype, out_dtype if index_out else None),
            "reduce_type": kind,
        },
    )


def norm(op):
    present = [t for t in tensors(op) if t]
    if not present:
        return None
    x = present[0]
    moved = sum(t.nbytes for t in present) + x.nbytes  # every operand read, the normalized tensor written
    return Estimate(
        "normalization",
        8.0 * x.numel,
        moved,
        _vector_precision(x.dtype),
        {
            "op_shape": tuple(x.shape),
            "dtype_in_out": (x.dtype, None),
            "stride_input": _stride(op, 0),
            "stride_output": None,
        },
    )


@dataclass(frozen=True)
class NormLayout:
    """Where a normalization op records what its count needs: the input, the channels (`shape`: the
    product of a normalized shape given as a concrete input there; `groups`: the input's dim 1 over
    the group count there; else the input's dim 1), the weight and bias (tensors, or for a backward
    the gradients its output mask asks for), training (a concrete flag there; else always), and a
    backward's output mask."""

    input: int = 0
    shape: int | None = None
    groups: int | None = None
    weight: int | None = None
    bias: int | None = None
    training: int | None = None
    mask: int | None = None
    backward: bool = False
    rms: bool = False


_BATCH = NormLayout(weight=1, bias=2, training=5)
_LAYER = NormLayout(shape=1, weight=2, bias=3)
_GROUP = NormLayout(weight=2, bias=3)
_NATIVE_GROUP = NormLayout(weight=1, bias=2)
_INSTANCE = NormLayout(weight=1, bias=2, training=5)
NORM_LAYOUTS = {
    **dict.fromkeys((f"aten::{impl}batch_norm" for impl in ("", "native_", "miopen_", "cudnn_")), _BATCH),
    **dict.fromkeys((f"aten::{impl}layer_norm" for impl in ("", "native_", "miopen_", "cudnn_")), _LAYER),
    "aten::group_norm": _GROUP,
    "aten::native_group_norm": _NATIVE_GROUP,
    "aten::miopen_group_norm": _GROUP,
    "aten::cudnn_group_norm": _GROUP,
    **dict.fromkeys((f"aten::{impl}instance_norm" for impl in ("", "native_", "miopen_", "cudnn_")), _INSTANCE),
    "aten::_fused_rms_norm": NormLayout(shape=1, weight=2, rms=True),
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)
    **dict.fromkeys(
        ("aten::batch_norm_backward", "aten::native_batch_norm_backward"),
        NormLayout(input=1, weight=2, training=7, backward=True),
    ),
    # (input, grad_output, weight, ...): cuDNN's and MIOpen's are the eval-statistics kind
    **dict.fromkeys(
        ("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward"),
        NormLayout(input=0, weight=2, training=-1, backward=True),
    ),
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    **dict.fromkeys(
        (f"aten::{impl}layer_norm_backward" for impl in ("", "native_", "miopen_", "cudnn_")),
        NormLayout(input=1, shape=2, mask=7, backward=True),
    ),
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
    **dict.fromkeys(
        (f"aten::{impl}group_norm_backward" for impl in ("", "native_", "miopen_", "cudnn_")),
        NormLayout(input=1, groups=8, weight=4, mask=9, backward=True),
    ),
    # (grad_out, input, normalized_shape, rstd, weight, output_mask)
    **dict.fromkeys(
        (
            "aten::_fused_rms_norm_backward",
            *(f"aten::{impl}rms_norm_backward" for impl in ("", "native_", "miopen_", "cudnn_")),
        ),
        NormLayout(input=1, shape=2, weight=4, mask=5, backward=True, rms=True),
    ),
}
# TraceLens models these and counts nothing for them (its instance-norm backward is not defined):
# their perf cells stay blank in both tools
UNCOUNTED = frozenset(f"aten::{impl}instance_norm_backward" for impl in ("", "native_", "miopen_", "cudnn_"))


def normalization(op):
    """Batch, layer, group, instance and RMS norms, forward and backward, counted as TraceLens counts
    them, for parity (`normalization_counts`, `rms_norm_counts`); the flags are read as the call
    passed them (TraceLens takes a batch norm for training and affine whatever the call said)."""
    layout = NORM_LAYOUTS[op.name]
    args = tensors(op)
    x = args[layout.input] if len(args) > layout.input else None
    if x is None or len(x.shape) < 2:
        return None
    mask = _flags(concrete(op, layout.mask)) if layout.mask is not None else [True, True, True]
    if layout.shape is not None:
        channels = math.prod(_literal_ints(concrete(op, layout.shape)) or [x.shape[-1]])
    elif layout.groups is not None:
        channels = x.shape[1] / int(concrete(op, layout.groups) or 1)
    else:
        channels = x.shape[1]
    if layout.backward and layout.mask is not None and not layout.rms:
        affine, bias = (mask + [False, False, False])[1:3]  # the gradients asked for say what there is
    else:
        affine = layout.weight is not None and _recorded(op, layout.weight)
        bias = layout.bias is not None and _recorded(op, layout.bias) if not layout.backward else True
    training = (
        True if layout.training is None else layout.training >= 0 and concrete(op, layout.training) in ("True", "1")
    )
    if layout.rms:
        flops, values = rms_norm_counts(x.numel, channels, affine, mask, layout.backward)
    else:
        flops, values = normalization_counts(
            x.numel, channels, affine, bias, training, mask if layout.backward else None
        )
    params = {
        "op_shape": tuple(x.shape),
        "dtype_in_out": (x.dtype, None),
        "stride_input": _stride(op, layout.input),
        "stride_output": None,
        "num_channels": channels,
        "has_bias": bool(bias) and not layout.rms,
        "is_affine": affine,
        "is_training": training and not layout.rms,
    }
    if layout.backward:
        params["output_mask"] = mask if layout.mask is not None else [True]
    return Estimate(
        "normalization", float(flops), values * DTYPE_BYTES.get(x.dtype, 4), _vector_precision(x.dtype), params
    )


def _flags(text: str) -> list[bool]:
    """An output mask as the trace records it ('[True, False, True]')."""
    return [part.strip() == "True" for part in text.strip("[]()").split(",") if part.strip()]


def normalization_counts(
    n: float, c: float, affine: bool, bias: bool, training: bool, mask: list[bool] | None
) -> tuple[float, float]:
    """FLOPs and values moved (of the input's dtype) of a batch/layer/group/instance norm over n
    elements in c channels, TraceLens's count. Forward (mask None): 2·n for the normalization and 6·c
    for the per-channel statistics and scale, 3·n more when training; the input read and the output
    written and per channel the mean and variance, the weight and bias where affine, two more
    statistics when training. Backward: per channel 4 values per element for the dot products, 5 more
    for the input gradient when training, 2 when it is not asked for, 3 for the inverse std when not
    training; the gradient and input read (the input twice when training and asked for) and the
    per-channel vectors."""
    if mask is None:
        flops = 3 * c + (3 * n if training else 0) + 3 * c + 2 * n
        vectors = 2 + (1 + (1 if bias else 0) if affine else 0) + (2 if training else 0)
        return flops, 2 * n + vectors * c
    per_channel = n / c
    flops = c * (
        (0 if training else 3)
        + 4 * per_channel
        + ((5 * per_channel if training else 0) if mask[0] else 2 * per_channel)
    )
    values = n + n * (2 if mask[0] and training else 1) + (c if training else 0)
    if affine:
        values += c + (c * (2 if bias else 1) if training else 0)
    return flops, values


def rms_norm_counts(n: float, c: float, affine: bool, mask: list[bool], backward: bool) -> tuple[float, float]:
    """FLOPs and values moved of an RMS norm over n elements in rows of c, TraceLens's count. Forward:
    per row 2·c + 2 for the root mean square, per element one multiply more where there is a weight;
    the input read, the output written, the weight. Backward: per element 1 (2 with a weight), 6 more
    for the input gradient if asked for, 1 (2 over several rows) for the weight's; the gradient read,
    the input twice, weight and its gradient."""
    if not backward:
        return n / c * (2 * c + 2) + n * (2 if affine else 1), 2 * n + (c if affine else 0)
    flops = n * (2 if affine else 1) + (6 * n if mask[0] else 0)
    if len(mask) > 1 and mask[1] and affine:
        flops += n * (2 if n / c > 1 else 1)
    return flops, 3 * n + (2 * c if affine else 0)


def _literal_ints(text: str) -> list[int] | None:
    """A concrete input such as '[4096]' as a list of ints (None if it is not one)."""
    parts = text.strip().strip("[]()").split(",")
    try:
        return [int(p) for p in parts if p.strip()] or None
    except ValueError:
        return None


def padded(op):
    """replication_padNd(self, padding) and upsample_nearestNd(self, output_size): every output
    element one copy (a FLOP, as TraceLens counts it) of an input element; the input read once, the
    output written. Padding pairs go innermost dim first."""
    x = tensors(op)[0] if tensors(op) else None
    sizes = _literal_ints(concrete(op, 1))
    if x is None or sizes is None:
        return None
    if "upsample" in op.name:
        out = tuple(x.shape[:2]) + tuple(sizes)
        extra = {}
    else:
        out = list(x.shape)
        for pair in range(len(sizes) // 2):
            out[len(out) - 1 - pair] += sizes[2 * pair] + sizes[2 * pair + 1]
        out = tuple(out)
        extra = {"padding": sizes}
    numel = math.prod(out)
    return Estimate(
        "elementwise",
        float(numel),
        x.nbytes + numel * DTYPE_BYTES.get(x.dtype, 4),
        _vector_precision(x.dtype),
        {
            "input_shape": tuple(x.shape),
            "output_shape": out,
            **extra,
            "op_shape": out,
            "dtype_in_out": (x.dtype, x.dtype),
            "stride_input": _stride(op, 0),
            "stride_output": None,
        },
    )


def softmax(op):
    x = tensors(op)[0] if tensors(op) else None
    if x is None:
        return None
    return Estimate("softmax", 5.0 * x.numel, 2 * x.nbytes, _vector_precision(x.dtype), {"numel": x.numel})


def index_select(op):
    t = tensors(op)
    src, index = t[0], t[2] if len(t) > 2 else None
    if not (src and index):
        return None
    dim = int(concrete(op, 1, "0") or 0) % len(src.shape)
    row = src.nbytes // src.shape[dim]
    return Estimate(
        "indexing", 0.0, index.nbytes + 2 * row * index.numel, _vector_precision(src.dtype), {"rows": index.numel}
    )


def embedding(op):
    t = tensors(op)
    weight, indices = t[0], t[1] if len(t) > 1 else None
    if not (weight and indices):
        return None
    row = weight.nbytes // weight.shape[0]
    return Estimate(
        "indexing",
        0.0,
        indices.nbytes + 2 * row * indices.numel,
        _vector_precision(weight.dtype),
        {"rows": indices.numel},
    )


def cat(op):
    parts = tensor_list(op, 0)
    if not parts:
        return None
    total = sum(p.nbytes for p in parts)
    return Estimate("copy", 0.0, 2.0 * total, _vector_precision(parts[0].dtype), {"inputs": len(parts)})


def foreach(op):
    lists = [tensor_list(op, i) for i, t in enumerate(op.input_types or []) if t == "TensorList"]
    if not lists or not lists[0]:
        return None
    reads = sum(p.nbytes for group in lists for p in group)
    writes = sum(p.nbytes for p in lists[0])
    return Estimate(
        "elementwise",
        float(sum(p.numel for p in lists[0])),
        reads + writes,
        _vector_precision(lists[0][0].dtype),
        {"tensors": len(lists[0])},
    )


# TraceLens's unary and binary elementwise ops (its UnaryElementwise and BinaryElementwise sheets);
# elementwise ops on neither take the binary parameters where they have two tensor operands
UNARY_OPS = {
    f"aten::{n}"
    for n in (
        "copy",
        "copy_",
        "clamp_min",
        "clamp_min_",
        "clamp_max",
        "clamp_max_",
        "sigmoid",
        "rsqrt",
        "silu",
        "neg",
        "pow",
    )
}
BINARY_OPS = {
    f"aten::{n}" for n in ("div", "div_", "mul", "mul_", "add", "add_", "sigmoid_backward", "threshold_backward")
}
ELEMENTWISE = (
    {
        f"aten::{n}"
        for n in (
            "add",
            "add_",
            "sub",
            "sub_",
            "mul",
            "mul_",
            "div",
            "div_",
            "neg",
            "rsqrt",
            "sqrt",
            "pow",
            "exp",
            "log",
            "sin",
            "cos",
            "tanh",
            "sigmoid",
            "silu",
            "silu_",
            "gelu",
            "relu",
            "relu_",
            "clamp",
            "clamp_min",
            "clamp_max",
            "where",
            "copy_",
            "fill_",
            "_to_copy",
            "clone",
            "abs",
            "reciprocal",
            "gelu_backward",
            "silu_backward",
            "threshold_backward",
            "sigmoid_backward",
            "tanh_backward",
            "addcmul",
            "addcdiv",
            "lerp",
            "masked_fill",
            "masked_fill_",
            "eq",
            "ne",
            "lt",
            "gt",
            "le",
            "ge",
            "bitwise_and",
            "bitwise_or",
            "logical_and",
            "triu",
            "tril",
        )
    }
    | UNARY_OPS
    | BINARY_OPS
)
REDUCTIONS = {
    f"aten::{n}"
    for n in (
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "prod",
        "logsumexp",
        "linalg_norm",
        "cumsum",
        "cumprod",
        "var",
        "std",
        "norm",
        "linalg_vector_norm",
        "any",
        "all",
    )
}
NORMS = {"aten::rms_norm", "aten::_batch_norm_impl_index"}  # outside TraceLens's NORM_LAYOUTS: a generic count
SOFTMAX = {f"aten::{n}" for n in ("_softmax", "softmax", "_log_softmax", "log_softmax", "_softmax_backward_data")}

REGISTRY = {
    "aten::mm": mm,
    "aten::addmm": addmm,
    "aten::bmm": bmm,
    "aten::baddbmm": baddbmm,
    "aten::linear": linear,
    "aten::_scaled_mm": scaled_mm,
    "aten::index_select": index_select,
    "aten::embedding": embedding,
    "aten::cat": cat,
    **{name: attention for name in ATTENTION},
    **{name: attention_backward for name in FLASH_BACKWARD},
    **{name: convolution for name in CONVOLUTION},
    "aten::convolution_backward": convolution_backward,
    **{name: elementwise for name in ELEMENTWISE},
    **{name: reduction for name in REDUCTIONS},
    **{name: norm for name in NORMS},
    **{name: normalization for name in NORM_LAYOUTS},
    **{
        name: padded
        for name in (f"aten::{kind}{n}d" for kind in ("replication_pad", "upsample_nearest") for n in (1, 2, 3))
    },
    **{name: softmax for name in SOFTMAX},
}
# The vendors' and attention libraries' ops TraceLens models add themselves to REGISTRY on import
# (their module builds on this one's helpers).
import magpie.traces.perf_models_vendor  # noqa: E402, F401

# The ops TraceLens models, each with the sheet it files them on (`tracelens_ops`). TraceLens
# models an op whole (everything launched inside it), so a perf row is the outermost of these
# around a kernel (aten::convolution, not the cudnn_convolution inside it), whether or not magpie
# models it.
TRACELENS_MODELS = tracelens_ops.SHEET
_TRACELENS_COMPILED = ("triton_poi_", "triton_red_", "triton_per_")  # Inductor's kernels, modelled by name


def models_whole_op(name: str) -> bool:
    """Whether TraceLens models this op (and so counts it with everything launched inside it)."""
    return name in TRACELENS_MODELS or name.startswith(_TRACELENS_COMPILED)


def estimate(op) -> Estimate | None:
    model = REGISTRY.get(op.name)
    if model is None and op.name.startswith("aten::_foreach_"):
        model = foreach
    if model is None:
        return None
    try:
        return model(op)
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
