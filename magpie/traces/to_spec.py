"""Kernels from a workload: an op's top signatures in a profiler trace made into a reference spec
(`magpie kernel from-trace`). Signatures are ranked by their share of the trace's GPU time (what
speeding them up can save of the whole, Amdahl), not by time per call. Each becomes a testcase of
one spec file: its inputs have the recorded shapes, dtypes and strides (the sizes a testcase's
shape names are the signature's distinct dimensions, so held-out shapes vary them together; a
shape other than the recorded one is made dense in the recorded dimension order), its reference
is the recorded op, its tolerances the dtype's. Written as text: nothing here imports torch.

Turned into specs: GEMMs, attention (as `scaled_dot_product_attention` of the query, key and
value, with the recorded causality, scale and grouped heads), forward norms (their first
output), elementwise ops (an in-place one as its functional form), reductions and softmax. Any
other op gets the reason it cannot be, in words."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from magpie.errors import UserError
from magpie.traces.ops_tables import SignatureGroup, signature_groups

# a trace's type names -> torch's dtype names
TORCH_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
}
# what a testcase's dtypes may name (`manifest.models.DTYPES`)
MANIFEST_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")
# (rtol, atol) by the output's dtype: a few units in its last place, with room for another order
# of summation
TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1e-2),
}
EXACT = (0.0, 0.0)  # integer and boolean outputs
SUPPORTED_FAMILIES = ("GEMM", "SDPA", "normalization", "elementwise", "reduction", "softmax")
# forward norms whose first output is the normalised tensor, and which change no input
FORWARD_NORMS = ("aten::native_layer_norm", "aten::layer_norm", "aten::rms_norm", "aten::native_group_norm")
SCALAR_TYPES = ("Scalar", "ScalarList", "bool", "Int", "int", "str", "string", "Device", "Layout")


class NoSpec(Exception):
    """This op cannot be made into a spec; str() says why."""


@dataclass
class Signature:
    """One signature of the op as a testcase: its share of the workload and its arguments."""

    group: SignatureGroup
    share: float  # of the trace's GPU time
    sizes: list[int]  # the distinct dimension sizes, in the order the arguments name them
    arguments: list[dict]  # {"tensor": [size indices], "dtype", "strides"} or {"value": text}
    dtype: str  # the first tensor's (the testcase's dtype)
    tolerances: tuple[float, float] = (0.0, 0.0)
    attention: dict = field(default_factory=dict)  # SDPA: causal, scale, grouped heads

    @property
    def calls(self) -> int:
        return len(self.group.times)

    @property
    def total_us(self) -> float:
        return self.group.total


def workload_ops(path: str | Path) -> tuple[list[SignatureGroup], float]:
    """Every op signature of the trace, longest total GPU time first, and the trace's GPU time."""
    from magpie.traces.ingest import TraceError, load_trace, trace_files

    if Path(path).is_dir():
        try:
            found = sorted(trace_files(path), key=lambda f: not f.name.endswith(".json.gz"))
        except TraceError:
            found = []
        example = f" (e.g. {found[0]})" if found else ""
        raise UserError(f"{path}: is a folder: name one trace in it{example}")
    try:
        trace = load_trace(path)
    except TraceError as err:
        raise UserError(str(err) if str(path) in str(err) else f"{path}: {err}") from None
    groups = signature_groups(trace)
    return groups, sum(g.total for g in groups)


def op_table(groups: list[SignatureGroup], workload_us: float) -> list[dict]:
    """Per op name: its share of the workload, calls, signatures, and whether a spec can be made
    (else why not), by share."""
    rows: dict[str, dict] = {}
    for group in groups:
        row = rows.setdefault(
            group.name, {"op": group.name, "total_us": 0.0, "calls": 0, "signatures": 0, "spec": None}
        )
        row["total_us"] += group.total
        row["calls"] += len(group.times)
        row["signatures"] += 1
        if row["spec"] is None:
            try:
                signature(group, workload_us)
                row["spec"] = "yes"
            except NoSpec as err:
                row["spec"] = f"no: {err}"
    for row in rows.values():
        row["share"] = row["total_us"] / workload_us if workload_us else 0.0
    return sorted(rows.values(), key=lambda r: -r["total_us"])


def top_signatures(groups: list[SignatureGroup], workload_us: float, op: str, top: int) -> list[Signature]:
    """The op's `top` signatures by share of the workload; one line where the op is absent or
    none of its signatures can be a spec."""
    mine = [g for g in groups if g.name == op]
    if not mine:
        names = sorted({g.name for g in groups if g.op is not None})
        raise UserError(
            f"{op}: not an op of this trace (its ops: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''})"
        )
    made, reasons = [], []
    for group in mine:
        try:
            made.append(signature(group, workload_us))
        except NoSpec as err:
            reasons.append(str(err))
        if len(made) == top:
            break
    if not made:
        raise UserError(f"{op}: cannot be made into a spec: {reasons[0]}")
    return made


def signature(group: SignatureGroup, workload_us: float) -> Signature:
    op = group.op
    if op is None:
        raise NoSpec("a kernel launched outside any op: there is no op to call as the reference")
    family = group.est.family if group.est is not None else None
    if family not in SUPPORTED_FAMILIES:
        raise NoSpec(
            f"no spec for its family ({family or 'no perf model'}); made for GEMM, attention, norms, "
            "elementwise ops, reductions and softmax"
        )
    if op.name.endswith("_backward") or "_backward_" in op.name:
        raise NoSpec("a backward op: make a spec of the forward op")
    if family == "normalization" and op.name not in FORWARD_NORMS:
        raise NoSpec("a norm that updates its running statistics in place (or a backward one)")
    sizes: list[int] = []
    arguments = []
    for dims, kind, strides, text in zip(
        op.input_dims or [], op.input_types or [], _padded(op.strides, op), _padded(op.concrete, op)
    ):
        if kind in TORCH_DTYPES and isinstance(dims, list) and all(isinstance(d, int) for d in dims):
            indices = []
            for d in dims:
                if d not in sizes:
                    sizes.append(d)
                indices.append(sizes.index(d))
            arguments.append(
                {"tensor": indices, "dtype": TORCH_DTYPES[kind], "strides": list(strides) if strides else None}
            )
        elif kind == "" and text == "":
            arguments.append({"value": "None"})
        elif kind in SCALAR_TYPES or kind == "":
            arguments.append({"value": _literal(text)})
        elif kind in ("TensorList", "GenericList"):
            raise NoSpec("it takes a list of tensors, whose shapes the trace does not record one by one")
        else:
            raise NoSpec(f"an argument of type {kind!r} magpie cannot make")
    tensors = [a for a in arguments if "tensor" in a]
    if not tensors:
        raise NoSpec("no tensor argument")
    dtype = tensors[0]["dtype"]
    if dtype not in MANIFEST_DTYPES:
        raise NoSpec(f"its inputs are {dtype}, which a testcase cannot name")
    made = Signature(group, group.total / workload_us if workload_us else 0.0, sizes, arguments, dtype)
    made.tolerances = TOLERANCES.get(dtype, EXACT)
    if family == "SDPA":
        params = group.est.params
        if len(tensors) != 3 or params.get("dropout"):
            raise NoSpec("attention with dropout, a mask tensor, or without query, key and value tensors")
        last = arguments[-1].get("value")  # the scale, where the op records one (None: 1/sqrt(head size))
        scale = float(last) if _is_number(last) and not isinstance(ast.literal_eval(last), bool) else None
        made.arguments = tensors[:3]
        made.attention = {
            "causal": bool(params.get("causal")),
            "scale": scale,
            "gqa": params.get("H_KV", params.get("H_Q")) != params.get("H_Q"),
        }
    return made


def _padded(values, op) -> list:
    return list(values or []) + [None] * (len(op.input_dims or []) - len(values or []))


def _literal(text: str | None) -> str:
    """A recorded argument's text as Python source: numbers, lists, booleans as they are, other
    words as strings."""
    if text is None or text == "":
        return "None"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return repr(text)
    return repr(value)


def _is_number(text) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def kernel_id(op: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", op).strip("_")


def spec_text(op: str, trace: str, signatures: list[Signature]) -> str:
    """The spec module: one `inputs_K(shape, dtype, generator)` per signature and `reference`."""
    call = (
        "torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=ATTENTION['causal'], "
        "scale=ATTENTION['scale'], enable_gqa=ATTENTION['gqa'])"
        if signatures[0].attention
        else f"_call(torch.ops.aten.{_functional(op)}, args)"
    )
    first_output = op in FORWARD_NORMS
    lines = [
        f'"""A spec made by `magpie kernel from-trace` from {Path(trace).name}: {op}, its top {len(signatures)} '
        "signature(s) by\nshare of the trace's GPU time, one testcase each. A testcase's shape is the signature's "
        "distinct\ndimension sizes (SIGNATURES[k]['sizes']); its recorded shape gets the recorded strides, any other "
        "is made\ndense in the recorded dimension order. The reference is the recorded op"
        + (", its first output" if first_output else "")
        + '."""',
        "",
        "import torch",
        "",
        "# per signature: its share of the workload's GPU time, calls, the sizes a testcase's shape names, and the",
        "# arguments: a tensor as the indices of its dimensions' sizes, its dtype and recorded strides; else a value",
        "SIGNATURES = [",
    ]
    for s in signatures:
        lines.append(
            f"    {{'share': {s.share:.4f}, 'calls': {s.calls}, 'total_us': {s.total_us:.1f}, 'sizes': {s.sizes}, "
            f"'arguments': {_arguments_source(s.arguments)}}},"
        )
    lines.append("]")
    if signatures[0].attention:
        lines.append(f"ATTENTION = {signatures[0].attention!r}")
    lines += [
        "",
        "",
        "def _tensor(dims, dtype, strides, recorded, generator):",
        "    dtype = getattr(torch, dtype)",
        "    if dtype.is_floating_point:",
        "        values = torch.randn(dims, generator=generator).to(dtype)",
        "    else:",
        "        values = torch.randint(0, 2 if dtype == torch.bool else 16, dims, generator=generator).to(dtype)",
        "    if not strides or len(strides) != len(dims):",
        "        return values",
        "    if recorded and 0 not in strides:",
        "        out = torch.empty_strided(dims, strides, dtype=dtype)",
        "        out.copy_(values)",
        "        return out",
        "    # dense in the recorded order of the dimensions, outermost first; a broadcast (stride 0) one expanded",
        "    order = sorted(range(len(dims)), key=lambda i: (-strides[i], i))",
        "    dense = values.permute(order).contiguous().permute([order.index(i) for i in range(len(dims))])",
        "    base = [1 if s == 0 else d for d, s in zip(dims, strides)]",
        "    return dense[tuple(slice(0, b) for b in base)].expand(dims) if base != list(dims) else dense",
        "",
        "",
        "def _inputs(index, shape, generator):",
        "    signature = SIGNATURES[index]",
        "    if len(shape) != len(signature['sizes']):",
        "        raise ValueError(f\"a shape of {len(signature['sizes'])} sizes, as {signature['sizes']}\")",
        "    recorded = list(shape) == signature['sizes']",
        "    args = []",
        "    for argument in signature['arguments']:",
        "        if 'tensor' in argument:",
        "            dims = [shape[i] for i in argument['tensor']]",
        "            args.append(_tensor(dims, argument['dtype'], argument['strides'], recorded, generator))",
        "        else:",
        "            value = argument['value']",
        "            # a list of sizes (a norm's normalized_shape) follows the shape",
        "            if isinstance(value, list) and value and all(isinstance(v, int) and v in signature['sizes'] and v > 1 for v in value):",
        "                value = [shape[signature['sizes'].index(v)] for v in value]",
        "            args.append(value)",
        "    return tuple(args)",
        "",
    ]
    for k in range(len(signatures)):
        lines += [
            "",
            f"def inputs_{k}(shape, dtype, generator):",
            f"    return _inputs({k}, shape, generator)",
            "",
        ]
    if signatures[0].attention:
        lines += ["", "def reference(query, key, value):", f"    return {call}", ""]
    else:
        lines += CALL_HELPER.splitlines()
        lines += ["", "def reference(*args):", f"    out = {call}"]
        lines += ["    return out[0]" if first_output else "    return out", ""]
    return "\n".join(lines)


# The recorded op called with its arguments as the trace lists them: keyword-only ones (a reduction's
# dtype, an add's alpha) are recorded in place, so each overload's schema says which are which.
CALL_HELPER = """

def _call(packet, args):
    failed = None
    for name in packet.overloads():
        overload = getattr(packet, name)
        params = overload._schema.arguments
        positional = [p for p in params if not p.kwarg_only]
        writes = any(p.alias_info is not None and p.alias_info.is_write for p in params)
        if len(args) > len(params) or writes:  # an out= or in-place overload
            continue
        keywords = {p.name: a for p, a in zip(params[len(positional) :], args[len(positional) :])}
        try:
            return overload(*args[: len(positional)], **keywords)
        except (RuntimeError, TypeError) as err:
            failed = err
    raise failed or TypeError(f"no overload of {packet} takes {len(args)} arguments")
"""


def baseline_text(op: str, signatures: list[Signature]) -> str:
    """The recorded op as an implementation: the kernel's baseline until one is written."""
    body = (
        "    return torch.nn.functional.scaled_dot_product_attention(\n"
        f"        query, key, value, is_causal={signatures[0].attention['causal']}, "
        f"scale={signatures[0].attention['scale']}, enable_gqa={signatures[0].attention['gqa']}\n    )\n"
        if signatures[0].attention
        else f"    out = _call(torch.ops.aten.{_functional(op)}, args)\n"
        + ("    return out[0]\n" if op in FORWARD_NORMS else "    return out\n")
    )
    head = "def kernel(query, key, value):\n" if signatures[0].attention else "def kernel(*args):\n"
    helper = "" if signatures[0].attention else CALL_HELPER + "\n"
    return (
        f'"""{op} as the trace recorded it: the baseline of kernels made from its signatures."""\n\n'
        f"import torch\n{helper}\n\n{head}{body}"
    )


def kernel_toml(op: str, folder: str, signatures: list[Signature]) -> str:
    """The `[[kernel]]` table to add to magpie.toml: one testcase per signature."""
    ident = kernel_id(op)
    lines = [
        "[[kernel]]",
        f'id = "{ident}"',
        'type = "pytorch"',
        'entry = "kernel"',
        "",
        "[kernel.baseline]",
        'id = "recorded"',
        f'source = "{folder}/baseline.py"',
    ]
    for k, s in enumerate(signatures):
        rtol, atol = s.tolerances
        lines += [
            "",
            f"[[kernel.testcases]]  # {s.share * 100:.1f}% of the workload's GPU time, {s.calls} calls",
            f'spec = "{folder}/spec.py"',
            f'inputs = "inputs_{k}"',
            f"shapes = [{s.sizes}]",
            f'dtypes = ["{s.dtype}"]',
            f"rtol = {rtol:g}",
            f"atol = {atol:g}",
        ]
    return "\n".join(lines) + "\n"


def _functional(op: str) -> str:
    """The ATen op's name in torch.ops.aten; an in-place op's functional form (the reference must
    leave its inputs as they were: magpie fails an implementation that changes them)."""
    name = op.removeprefix("aten::")
    return name[:-1] if name.endswith("_") else name


def _arguments_source(arguments: list[dict]) -> str:
    parts = []
    for a in arguments:
        if "tensor" in a:
            parts.append(f"{{'tensor': {a['tensor']}, 'dtype': '{a['dtype']}', 'strides': {a['strides']}}}")
        else:
            parts.append(f"{{'value': {a['value']}}}")
    return "[" + ", ".join(parts) + "]"
