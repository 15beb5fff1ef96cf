"""TraceLens-style operation tables from one parsed trace: `ops_summary.csv` (per op name),
`ops_summary_by_category.csv` (per category) and `ops_unique_args.csv` from `signature_groups`
(an op's time is the GPU time of what it launched directly: kernels, memcpy, memset, its
innermost-op activities), and `unified_perf_summary.csv` and the per-family sheets (with the
perf models' metrics) from the perf rows of `perf_rows.py`; TraceLens's column names,
categories and units (MiB); values are written unrounded."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress
from operator import attrgetter, itemgetter

import msgspec

from magpie.traces.ingest import CpuOp, Trace
from magpie.traces.kernels import category
from magpie.traces.perf_models import Estimate, estimate
from magpie.traces.stats import population_std, sample_std
from magpie.traces.tracelens_ops import category_by_name

STATS = ("mean", "median", "std", "min", "max")
MIB = 2**20  # TraceLens's "MB" columns are MiB
OPS_SUMMARY = [
    "name",
    "total_direct_kernel_time_sum",
    "total_subtree_kernel_time_sum",
    "total_direct_kernel_time_ms",
    "total_subtree_kernel_time_ms",
    "Count",
    "Categories",
    "Percentage (%)",
    "Cumulative Percentage (%)",
]
BY_CATEGORY = ["op category", "Count", "total_direct_kernel_time_ms", "Percentage (%)", "Cumulative Percentage (%)"]
WHERE = ["process_name", "process_label", "thread_name"]
UNIQUE_ARGS = [
    "name",
    "op category",
    *WHERE,
    "Input Dims",
    "Input type",
    "Input Strides",
    "Concrete Inputs",
    "operation_count",
    *(f"total_{kind}_kernel_time_{s}" for s in STATS for kind in ("direct", "subtree")),
    "total_direct_kernel_time_sum",
    "total_subtree_kernel_time_sum",
    "ex_UID",
    "kernel_details_summary",
    "trunc_kernel_details",
    "Percentage (%)",
    "Cumulative Percentage (%)",
]
# TraceLens's order; "duration_us" is the op's CPU duration, "Roofline Time" the time at the roof
# (the larger of FLOPs at the compute peak and bytes at the memory bandwidth)
UNIFIED = [
    "name",
    "op category",
    *WHERE,
    "Input Dims",
    "Input type",
    "Input Strides",
    "Concrete Inputs",
    "ex_UID",
    "operation_count",
    "total_duration_us",
    "mean_duration_us",
    "std_duration_us",
    "GFLOPS",
    "Data Moved (MB)",
    "FLOPS/Byte",
    "Compute Spec",
    "Roofline Bound",
    "TB/s_mean",
    "TB/s_std",
    "TFLOPS/s_mean",
    "TFLOPS/s_std",
    "Kernel Time (µs)_mean",
    "Kernel Time (µs)_std",
    "Kernel Time (µs)_sum",
    "duration_us_median",
    "duration_us_min",
    "duration_us_max",
    "TB/s_median",
    "TB/s_min",
    "TB/s_max",
    "TFLOPS/s_median",
    "TFLOPS/s_min",
    "TFLOPS/s_max",
    "Roofline Time (µs)_first",
    *(f"Pct Roofline_{s}" for s in STATS),
    "Kernel Time (µs)_median",
    "Kernel Time (µs)_min",
    "Kernel Time (µs)_max",
    "kernel_details_summary",
    "trunc_kernel_details",
    "perf_params",
    "has_perf_model",
    "Percentage (%)",
    "Cumulative Percentage (%)",
]
# A family sheet's columns after its name and its model's parameters: the unified row's values, in
# TraceLens's names (a "_first" value is the first call's, the same for every call of a signature)
FAMILY_SHEET = [
    "GFLOPS_first",
    "Data Moved (MB)_first",
    "FLOPS/Byte_first",
    *(f"TB/s_{s}" for s in STATS),
    *(f"TFLOPS/s_{s}" for s in STATS),
    *(f"{w}_first" for w in WHERE),
    "Compute Spec",
    "Roofline Time (µs)_first",
    "Roofline Bound_first",
    *(f"Pct Roofline_{s}" for s in STATS),
    "kernel_details__summarize_kernel_stats",
    "trunc_kernel_details",
    "Input Dims_first",
    "Input type_first",
    "Input Strides_first",
    "Concrete Inputs_first",
    *(f"Kernel Time (µs)_{s}" for s in STATS),
    "Kernel Time (µs)_sum",
    "name_count",
    "UID_first",
]
_FAMILY_NAMES = {
    "GFLOPS_first": "GFLOPS",
    "Data Moved (MB)_first": "Data Moved (MB)",
    "FLOPS/Byte_first": "FLOPS/Byte",
    "Roofline Bound_first": "Roofline Bound",
    "kernel_details__summarize_kernel_stats": "kernel_details_summary",
    "Input Dims_first": "Input Dims",
    "Input type_first": "Input type",
    "Concrete Inputs_first": "Concrete Inputs",
    "Input Strides_first": "Input Strides",
    "name_count": "operation_count",
    "UID_first": "ex_UID",
    **{f"{w}_first": w for w in WHERE},
}
# TraceLens's names of the peaks: matrix (tensor-core) specs by magpie's precision; vector ops by dtype
COMPUTE_SPEC = {
    "bf16_tensor": "matrix_bf16",
    "fp16_tensor": "matrix_fp16",
    "tf32_tensor": "matrix_fp32",
    "fp8_tensor": "matrix_fp8",
    "fp64_tensor": "matrix_fp64",
    "int8_tensor": "matrix_int8",
}
VECTOR_SPEC = {
    "c10::BFloat16": "vector_bf16",
    "c10::Half": "vector_fp16",
    "float": "vector_fp32",
    "double": "vector_fp64",
}
# TraceLens's performance-metric sheets, one CSV each: the calls of the ops it files there
# (perf_models.TRACELENS_MODELS) grouped by model parameters, a "param: <name>" column per
# parameter and then FAMILY_SHEET.
PERF_FAMILIES = (
    "GEMM",
    "CONV_fwd",
    "CONV_bwd",
    "SDPA_fwd",
    "SDPA_bwd",
    "UnaryElementwise",
    "BinaryElementwise",
    "Reduce_fwd",
    "Normalization",
)

_OUTSIDE = "(launched outside any CPU op)"
_DRIVER_LAUNCHES = ("cuLaunchKernel", "hipModuleLaunchKernel")
SYNTHETIC = "{}->{} (Synthetic Op)"


def op_category(name: str, launched: list) -> str:
    """TraceLens's op category: from its tables of ops (`tracelens_ops`), else from the op's name
    (triton...), else from what it launched, whether or not magpie models the op."""
    return category_by_name(name) or _kernel_fallback(launched)


def _kernel_fallback(launched: list) -> str:
    """TraceLens's category of an op it has no model for: from the first thing the op launched
    (a memset too), where that is one of ATen's kernels: elementwise (mse_loss, random_,
    bitwise_not), reduce (argmax), multi_tensor_apply; otherwise other."""
    first = min(launched, key=_START).name if launched else ""
    if first.startswith("void at::native"):
        for kind in ("elementwise", "reduce", "multi_tensor_apply"):
            if kind in first:
                return kind
    return "other"


@dataclass
class SignatureGroup:
    """Every call of one op with one argument signature (or, outside any op, one kernel of one
    kind of launch: TraceLens's '<launch>-><kernel> (Synthetic Op)'); perf_rows groups its perf
    rows' calls and the family sheets' in these too."""

    name: str
    op: CpuOp | None
    est: Estimate | None
    category: str
    op_name: str = ""  # the ops_summary row it adds to: the op, or the runtime call that launched it
    times: list[float] = field(default_factory=list)  # direct GPU time of each call (kernels, memcpy, memset), µs
    subtree: list[float] = field(default_factory=list)  # the same with every child op's, µs
    launches: dict = field(default_factory=dict)  # outside any op: launch -> its whole GPU time (one call of op_name)
    cpu: list[float] = field(default_factory=list)  # each call's CPU duration, µs
    calls: list = field(default_factory=list)  # what each call launched, in launch order (GpuActivity lists)
    call_launches: list = field(default_factory=list)  # outside any op: the launch each call belongs to
    where: tuple = ("", "", "")  # the process's name and label and the thread's name of its calls
    uid: int | None = None  # TraceLens's UID of its first call (ex_UID)
    params: dict = field(default_factory=dict)  # its model's parameters (perf rows: est.params, a GEMM's transposes)
    launch_uid: int | None = None  # outside any op: the UID of the first runtime call it came from

    @property
    def total(self) -> float:
        return sum(self.times)

    @cached_property
    def kernel_names(self) -> list[str]:
        """The names of what its calls launched, each once, in the order they first come."""
        return list(dict.fromkeys(activity.name for launched in self.calls for activity in launched))

    @cached_property
    def time_stats(self) -> dict:
        """The statistics of `times`, which ops_unique_args and unified_perf_summary both show;
        read once the group is complete."""
        return _stats(self.times, "")

    @cached_property
    def kernel_columns(self) -> dict:
        """kernel_details_summary and trunc_kernel_details, which both tables show; read once
        the group is complete."""
        return _kernel_columns(self)


def subtree_times(trace: Trace) -> dict[int, float]:
    """GPU time of each CPU op and every op nested in it on its thread, µs."""
    parent = trace.op_parents
    totals: dict[int, float] = {}
    for activity in trace.gpu:
        index = activity.op
        dur = (activity.ts + activity.dur) - activity.ts  # as busy_time reads it
        while index is not None:
            totals[index] = totals.get(index, 0.0) + dur
            index = parent.get(index)
    return totals


def busy_time(activities: list) -> float:
    """GPU time of one call: the length of the union of its activities' [ts, ts + dur] (kernels
    of one graph launch overlap under programmatic dependent launch), from the timestamps as
    TraceLens reads them, so that even the rounding agrees (µs timestamps near 5e12 keep 2**-10 µs)."""
    if len(activities) == 1:
        a = activities[0]
        return (a.ts + a.dur) - a.ts
    total, end = 0.0, float("-inf")
    for start, stop in sorted((a.ts, a.ts + a.dur) for a in activities):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def signature_groups(trace: Trace, collectives: bool = True) -> list[SignatureGroup]:
    """Calls grouped by op and argument signature, longest total GPU time first; the perf model
    is evaluated once per group. Both the op tables and the roofline rows read these. An op's
    time is what it launched directly: kernels, and the memcpy and memset it issued; without
    `collectives`, less its NCCL/RCCL kernels (a call that launched only those is none)."""
    return grouped_calls(trace, trace_calls(trace, collectives))


def trace_calls(trace: Trace, collectives: bool = True) -> list[tuple]:
    """The calls signature_groups groups, in the order of their first activities: (launcher,
    what it launched, its GPU time, that of its op's subtree (outside any op: of its whole
    launch), its signature's number). A stage view cutting no call and no op's subtree has the
    very calls of its trace that fall in its steps (perf_rows.TraceCalls.stage)."""
    launches: dict = {}
    for activity in trace.gpu:
        if not collectives and category(activity.name, activity.kind) == "communication":
            continue
        # outside any op, each kernel is its own call (Triton's launcher calls the driver
        # directly; a graph launch replays several kernels)
        launcher = activity.op if activity.op is not None else ("launch", activity.launch, activity.ts)
        launched = launches.get(launcher)
        if launched is None:
            launches[launcher] = [activity]
        else:
            launched.append(activity)
    subtree = subtree_times(trace) if any(isinstance(key, int) for key in launches) else {}
    # a launch outside any op is one call of its runtime function however many kernels it replays
    by_launch: dict = {}
    for key, launched in launches.items():
        if not isinstance(key, int) and key[1] is not None:
            by_launch.setdefault(key[1], []).extend(launched)
    whole = {launch: busy_time(activities) for launch, activities in by_launch.items()}
    numbers: dict[tuple, int] = {}
    encode = msgspec.json.encode  # a signature key several times faster than repr() of the argument lists
    # ops share their decoded inputs (ingest): ops alike in name, thread and the very input
    # objects are one signature, found without encoding their arguments again
    alike: dict[tuple, int] = {}
    calls = []
    for launcher, launched in launches.items():
        time = busy_time(launched)
        if isinstance(launcher, int):
            op = trace.cpu_ops[launcher]
            same = (op.name, op.pid, op.tid, id(op.input_dims), id(op.input_types), id(op.strides), id(op.concrete))
            number = alike.get(same)
            if number is None:
                key = (op.name, encode((op.input_dims, op.input_types, op.strides, op.concrete)), where_of(trace, op))
                number = alike[same] = numbers.setdefault(key, len(numbers))
            calls.append((launcher, launched, time, subtree.get(launcher, time), number))
        else:
            first = launched[0]
            launch = trace.launches[first.launch] if first.launch is not None else None
            key = (
                (launch.name, first.name, where_of(trace, launch))
                if launch is not None
                else (_OUTSIDE, first.name, ("", "", ""))
            )
            number = numbers.setdefault(key, len(numbers))
            calls.append((launcher, launched, time, whole.get(first.launch, time), number))
    return calls


def grouped_calls(trace: Trace, calls: list[tuple]) -> list[SignatureGroup]:
    """Calls (`trace_calls`'s, or a stage's part of them) grouped by signature, longest total GPU
    time first, ties to the signature called first; a group's op, category and UID are its first
    call's."""
    groups: dict[int, SignatureGroup] = {}
    # TraceLens numbers the synthetic op of each kernel outside any op after the trace's events
    synthetic = trace.events
    for launcher, launched, time, around, number in calls:
        group = groups.get(number)
        if isinstance(launcher, int):
            op = trace.cpu_ops[launcher]
            if group is None:
                est = estimate(op)
                group = groups[number] = SignatureGroup(
                    op.name,
                    op,
                    est,
                    op_category(op.name, launched),
                    op.name,
                    where=where_of(trace, op),
                    uid=trace.op_uids[launcher],
                )
            group.subtree.append(around)
            group.cpu.append(op.dur)
        else:
            first = launched[0]
            launch = trace.launches[first.launch] if first.launch is not None else None
            if group is None:
                launch_name = launch.name if launch is not None else _OUTSIDE
                group = groups[number] = SignatureGroup(
                    SYNTHETIC.format(launch_name, first.name),
                    None,
                    None,
                    "other",
                    launch_name,
                    where=where_of(trace, launch) if launch is not None else ("", "", ""),
                    uid=synthetic,
                )
            synthetic += 1
            group.subtree.append(time)
            launch_key = first.launch if first.launch is not None else launcher
            group.launches[launch_key] = around
            group.call_launches.append(launch_key)
            if launch is not None:
                uid = trace.launch_uids[first.launch]
                group.launch_uid = uid if group.launch_uid is None else min(group.launch_uid, uid)
                group.cpu.append(launch.dur)  # the runtime call's duration, as TraceLens's synthetic op has it
        group.times.append(time)
        group.calls.append(launched)
    return sorted(groups.values(), key=lambda g: -g.total)


def held_group(view: Trace, whole: SignatureGroup, flags: list[bool]) -> SignatureGroup:
    """An op's signature group of a stage view, from the trace's (`whole`): its calls that the
    view holds (`flags`), the first of them its first, as grouped_calls makes it."""
    calls = list(compress(whole.calls, flags))
    first = calls[0][0].op
    op = view.cpu_ops[first]
    est = estimate(op)
    return SignatureGroup(
        whole.name,
        op,
        est,
        op_category(op.name, calls[0]),
        whole.op_name,
        times=list(compress(whole.times, flags)),
        subtree=list(compress(whole.subtree, flags)),
        cpu=list(compress(whole.cpu, flags)),
        calls=calls,
        where=whole.where,
        uid=view.op_uids[first],
    )


def launcher_of(activity) -> int | tuple:
    """What trace_calls files an activity's call under."""
    return activity.op if activity.op is not None else ("launch", activity.launch, activity.ts)


def where_of(trace: Trace, call) -> tuple[str, str, str]:
    """The process's name and label and the thread's name of a call (a CPU op or a launch), from
    the trace's metadata events ("" where it has none)."""
    return (
        trace.process_names.get(call.pid, ""),
        trace.process_labels.get(call.pid, ""),
        trace.thread_names.get((call.pid, call.tid), ""),
    )


def _percentages(rows: list[dict], key: str) -> None:
    total = sum(r[key] for r in rows) or 1.0
    running = 0.0
    for row in rows:
        row["Percentage (%)"] = 100 * row[key] / total
        running += 100 * row[key] / total
        row["Cumulative Percentage (%)"] = running


def categories_of(text: str) -> list[str]:
    """The categories of an ops_summary row's `Categories` cell (a Python list of strings)."""
    return [part.strip(" '") for part in text.strip("[]").split(",")]


def ops_tables(
    groups: list[SignatureGroup], perf: list[SignatureGroup], sheets: dict[str, list[SignatureGroup]], arch=None
) -> dict[str, list[dict]]:
    """The op tables: ops_summary, by category and unique args from the signature groups, the
    unified table from the perf rows (`perf`) and each family sheet from its groups (`sheets`);
    with the device's peaks (`arch`) the perf rows get their roofline."""
    by_name: dict[str, dict] = {}
    for group in groups:
        named = by_name.get(group.op_name)
        if named is None:
            # "op category" is what magpie's pages show (Triton's launcher calls the driver directly:
            # "triton"); the CSVs carry TraceLens's categories
            shown = "triton" if group.op is None and group.op_name.startswith(_DRIVER_LAUNCHES) else group.category
            named = by_name[group.op_name] = {
                "name": group.op_name,
                "op category": shown,
                "total_direct_kernel_time_sum": 0.0,
                "total_subtree_kernel_time_sum": 0.0,
                "Count": 0,
                "categories": {},
                "launches": {},
            }
        named["categories"][group.category] = True
        if group.op is None:
            named["launches"].update(group.launches)
        else:
            named["total_direct_kernel_time_sum"] += group.total
            named["total_subtree_kernel_time_sum"] += sum(group.subtree)
            named["Count"] += len(group.times)
    for row in by_name.values():
        launches = row.pop("launches")
        row["Count"] += len(launches)
        row["total_direct_kernel_time_sum"] += sum(launches.values())
        row["total_subtree_kernel_time_sum"] += sum(launches.values())
    ops = in_tracelens_order(list(by_name.values()), "name", "total_direct_kernel_time_sum")
    for row in ops:
        row["Categories"] = repr(list(row.pop("categories")))
        row["total_direct_kernel_time_ms"] = row["total_direct_kernel_time_sum"] / 1000
        row["total_subtree_kernel_time_ms"] = row["total_subtree_kernel_time_sum"] / 1000
    _percentages(ops, "total_direct_kernel_time_sum")
    categories: dict[str, dict] = {}
    for row in ops:
        first = next(iter(categories_of(row["Categories"])))
        cat = categories.setdefault(first, {"op category": first, "Count": 0, "total_direct_kernel_time_ms": 0.0})
        cat["Count"] += row["Count"]
        cat["total_direct_kernel_time_ms"] += row["total_direct_kernel_time_ms"]
    by_category = in_tracelens_order(list(categories.values()), "op category", "total_direct_kernel_time_ms")
    _percentages(by_category, "total_direct_kernel_time_ms")
    unique = [_unique_args_row(g) for g in _by_launch(groups)]
    _percentages(unique, "total_direct_kernel_time_sum")
    # a sheet's group is often a unified row's very group (the same calls): its row is made once
    unified_rows = {id(g): _unified_row(g, arch) for g in perf}
    family_sheets: dict[str, list[dict]] = {}
    for family in PERF_FAMILIES:
        family_sheets[family] = []
        for group in sheets.get(family, []):
            row = unified_rows.get(id(group)) or _unified_row(group, arch)
            family_sheets[family].append(
                {
                    **row,
                    **{ours: row.get(theirs) for ours, theirs in _FAMILY_NAMES.items()},
                    **{f"param: {k}": v for k, v in group.params.items()},
                }
            )
    unified = list(unified_rows.values())
    _percentages(unified, "Kernel Time (µs)_sum")
    return {
        "ops_summary": ops,
        "ops_summary_by_category": by_category,
        "ops_unique_args": unique,
        "unified_perf_summary": unified,
        **family_sheets,
    }


def _by_launch(groups: list[SignatureGroup]) -> list[SignatureGroup]:
    """ops_unique_args's groups: outside any op, one per runtime function (cudaGraphLaunch,
    cuLaunchKernelEx), each launch one call, rather than one per kernel."""
    merged: dict[str, SignatureGroup] = {}
    out = []
    for group in groups:
        if group.op is not None:
            out.append(group)
            continue
        into = merged.get(group.op_name)
        if into is None:
            into = merged[group.op_name] = SignatureGroup(
                group.op_name, None, None, group.category, group.op_name, where=group.where
            )
            out.append(into)
        into.launches.update(group.launches)
        if group.launch_uid is not None:
            into.uid = group.launch_uid if into.uid is None else min(into.uid, group.launch_uid)
        for launch, launched in zip(group.call_launches, group.calls):
            into.call_launches.append(launch)
            into.calls.append(launched)
    for into in merged.values():
        into.times = list(into.launches.values())
        by_launch: dict = {}
        for launch, launched in zip(into.call_launches, into.calls):
            by_launch.setdefault(launch, []).extend(launched)
        into.calls = [sorted(launched, key=lambda a: a.ts) for launched in by_launch.values()]
    # a tie goes to the signature called first, as TraceLens's are
    return sorted(out, key=lambda g: (-g.total, g.uid if g.uid is not None else -1))


def in_tracelens_order(rows: list[dict], label: str, total: str) -> list[dict]:
    """Rows by `total`, largest first, in TraceLens's order: pandas groups them by `label` (sorted)
    and sorts descending with numpy's quicksort, which is not stable, so rows of equal totals come
    in the order that sort leaves them (pandas reverses the values, argsorts, reverses back). With
    no tie, or without numpy, a stable sort gives it (ties then by label)."""
    rows = sorted(rows, key=itemgetter(label))
    totals = [row[total] for row in rows]
    if len(set(totals)) == len(totals):
        return sorted(rows, key=lambda row: -row[total])
    try:
        import numpy  # noqa: PLC0415 (only where rows tie)
    except ImportError:
        return sorted(rows, key=lambda row: -row[total])
    last = len(rows) - 1
    ascending = numpy.asarray(totals[::-1], dtype=float).argsort(kind="quicksort")
    return [rows[last - int(i)] for i in ascending][::-1]


# TraceLens's roofline columns, which a perf table has only where some row has a roofline (a peak for
# its precision, its bytes and FLOPs)
ROOFLINE = {"Roofline Time (µs)_first", "Roofline Bound", "Roofline Bound_first", *(f"Pct Roofline_{s}" for s in STATS)}


def table_columns(name: str, rows: list[dict]) -> list[str]:
    """The CSV columns of a table: fixed ones, and for a family sheet its parameters too, in the
    order the trace's calls first name them (as TraceLens's columns come); a perf table whose rows
    have no roofline leaves out the roofline columns, as TraceLens's does."""
    fixed = {
        "ops_summary": OPS_SUMMARY,
        "ops_summary_by_category": BY_CATEGORY,
        "ops_unique_args": UNIQUE_ARGS,
        "unified_perf_summary": UNIFIED,
    }.get(name)
    if fixed is not None and name != "unified_perf_summary":
        return fixed
    if fixed is None:
        in_trace_order = sorted(rows, key=lambda row: row["UID_first"])
        params = dict.fromkeys(k for row in in_trace_order for k in row if k.startswith("param: "))
        fixed = ["name", *params, *FAMILY_SHEET]
    if any(row.get("Roofline Time (µs)_first") is not None for row in rows):
        return fixed
    return [column for column in fixed if column not in ROOFLINE]


def _stats(values: list[float], prefix: str) -> dict:
    """Mean, median, sample standard deviation (none for one value), min and max, unrounded."""
    if not values:
        return {}
    return {
        f"{prefix}_mean": statistics.fmean(values),
        f"{prefix}_median": statistics.median(values),
        f"{prefix}_std": sample_std(values) if len(values) > 1 else None,
        f"{prefix}_min": min(values),
        f"{prefix}_max": max(values),
    }


def _prefixed(stats: dict, prefix: str) -> dict:
    """_stats(values, "") under another prefix."""
    return {prefix + key: value for key, value in stats.items()}


_START = attrgetter("ts")


def _one_place(calls: list) -> dict[tuple, list[float]] | None:
    """_kernel_details's places where every call launched one thing, the same kernel on the same
    stream (most groups), found without a step per call; else None."""
    if not calls or max(map(len, calls)) != 1:
        return None
    launched = list(map(_FIRST, calls))
    names, streams = set(map(_NAME, launched)), set(map(_STREAM, launched))
    if len(names) != 1 or len(streams) != 1:
        return None
    return {(0, names.pop(), streams.pop()): list(map(_DURATION, launched))}


_FIRST, _NAME, _STREAM, _DURATION = itemgetter(0), attrgetter("name"), attrgetter("stream"), attrgetter("dur")


def _kernel_details(group: SignatureGroup) -> list[dict]:
    """TraceLens's kernel_details_summary: one entry per place in a call's launches (the k-th thing
    each call launched), with its stream and the statistics of its durations over the calls
    (population standard deviation), smallest total first."""
    places = _one_place(group.calls)
    if places is None:
        places = {}
        for launched in group.calls:
            for position, activity in enumerate(launched if len(launched) == 1 else sorted(launched, key=_START)):
                place = (position, activity.name, activity.stream)
                durations = places.get(place)
                if durations is None:
                    places[place] = [activity.dur]
                else:
                    durations.append(activity.dur)
    details = []
    for (_, name, stream), durations in places.items():
        total = sum(durations)
        mean = statistics.fmean(durations)  # correctly rounded, as pandas's compensated mean: 1.775, not 1.7749...
        details.append(
            {
                "name": name,
                "stream": stream,
                "count": len(durations),
                "total_duration_us": total,
                "mean_duration_us": mean,
                "median_duration_us": statistics.median(durations),
                "std_dev_duration_us": population_std(durations, mean),
                "min_duration_us": min(durations),
                "max_duration_us": max(durations),
            }
        )
    details.sort(key=lambda d: d["total_duration_us"])
    return details


def _kernel_columns(group: SignatureGroup) -> dict:
    """kernel_details_summary and its short form, trunc_kernel_details: each entry's name cut to
    64 characters (then '...'), its stream and mean duration to 0.01 µs (hundredths rounded half
    to even in binary, as TraceLens's are: 1.185 -> 1.18)."""
    details = _kernel_details(group)
    short = [
        {
            "name": d["name"] if len(d["name"]) <= 64 else d["name"][:64] + "...",
            "stream": d["stream"],
            "mean_duration_us": round(d["mean_duration_us"] * 100) / 100,
        }
        for d in details
    ]
    return {"kernel_details_summary": repr(details), "trunc_kernel_details": repr(short) if short else None}


def _signature(group: SignatureGroup) -> dict:
    op = group.op
    return {
        "name": group.name,
        "op category": group.category,
        **dict(zip(WHERE, group.where)),
        "Input Dims": python_cell(op.input_dims) if op else "",
        "Input type": python_cell(op.input_types) if op else "",
        "Input Strides": python_cell(op.strides) if op and op.strides is not None else "",
        "Concrete Inputs": python_cell(op.concrete) if op and op.concrete is not None else "",
        "ex_UID": group.uid,
    }


def python_cell(value) -> str:
    """A recorded argument list as TraceLens writes it, the Python repr with lists as tuples
    (`((4, 512), (512,))`, `('c10::BFloat16', '')`), so that its tables and these join on it."""
    return repr(_as_tuples(value))


def _as_tuples(value):
    return tuple(map(_as_tuples, value)) if isinstance(value, list) else value


def _unique_args_row(group: SignatureGroup) -> dict:
    subtree = group.subtree if group.op is not None else group.times
    # most often no op inside launched anything: the subtree times are the direct ones, whose
    # statistics are worked out already
    alike = subtree == group.times
    return {
        **_signature(group),
        "operation_count": len(group.times),
        "total_direct_kernel_time_sum": group.total,
        "total_subtree_kernel_time_sum": group.total if alike else sum(subtree),
        **_prefixed(group.time_stats, "total_direct_kernel_time"),
        **(
            _prefixed(group.time_stats, "total_subtree_kernel_time")
            if alike
            else _stats(subtree, "total_subtree_kernel_time")
        ),
        **group.kernel_columns,
    }


def _unified_row(group: SignatureGroup, arch=None) -> dict:
    times, est = group.times, group.est
    out = {
        **_signature(group),
        "operation_count": len(times),
        "Kernel Time (µs)_sum": group.total,
        **_prefixed(group.time_stats, "Kernel Time (µs)"),
        "has_perf_model": est is not None,
        **group.kernel_columns,
    }
    if group.cpu:
        cpu = _stats(group.cpu, "duration_us")
        out.update(
            {
                "total_duration_us": sum(group.cpu),
                "mean_duration_us": cpu.pop("duration_us_mean"),
                "std_duration_us": cpu.pop("duration_us_std"),
                **cpu,
            }
        )
    if est is not None:
        seconds = [t / 1e6 for t in times if t > 0]
        out.update(
            {
                "GFLOPS": est.flops / 1e9,
                "Data Moved (MB)": est.bytes / MIB,
                "FLOPS/Byte": est.flops / est.bytes if est.bytes else None,
                **_stats([est.flops / s / 1e12 for s in seconds], "TFLOPS/s"),
                **_stats([est.bytes / s / 1e12 for s in seconds], "TB/s"),
                "perf_params": repr(group.params),
                "compute_spec": est.precision,
                "Compute Spec": _compute_spec(group),
            }
        )
        roof = _roofline_time(est, arch)
        if roof is not None:
            out.update(
                {
                    "Roofline Time (µs)_first": roof[0],
                    "Roofline Bound": roof[1],
                    **_stats([100 * roof[0] / t for t in times if t > 0], "Pct Roofline"),
                }
            )
    return out


def _compute_spec(group: SignatureGroup) -> str | None:
    """TraceLens's name of the peak an op is held against: matrix_<dtype> for tensor-core work,
    vector_<dtype of the first tensor> otherwise."""
    est = group.est
    if est.precision in COMPUTE_SPEC:
        return COMPUTE_SPEC[est.precision]
    dtypes = [t for t in (group.op.input_types or []) if t in VECTOR_SPEC] if group.op else []
    return VECTOR_SPEC.get(dtypes[0]) if dtypes else None


def _roofline_time(est: Estimate, arch) -> tuple[float, str] | None:
    """The time at the roof, µs, and what bounds it: the larger of the FLOPs at the compute peak
    and the bytes at the memory bandwidth."""
    if arch is None or not arch.memory_tbps or not (est.flops or est.bytes):  # nothing to hold against a roof
        return None
    memory = est.bytes / (arch.memory_tbps * 1e12)
    peak = arch.peak(est.precision)
    compute = est.flops / (peak * 1e12) if peak else 0.0
    return max(memory, compute) * 1e6, "COMPUTE_BOUND" if compute > memory else "MEMORY_BOUND"
