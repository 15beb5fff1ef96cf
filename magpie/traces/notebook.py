"""The trace analysis as pandas DataFrames, for notebooks: `magpie.traces.open(path)` parses a
profiler trace once and its methods return the tables `magpie benchmark --trace-dir` writes as
CSVs (same rows, columns and values), and `magpie.traces.comparison(before, after)` those of
`--compare-traces`. pandas is imported here only, so that `import magpie` and the CLI never pay
for it."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from magpie.errors import UserError
from magpie.traces.collectives import COLUMNS as COLL_COLUMNS
from magpie.traces.collectives import coll_analysis
from magpie.traces.compare import COLUMNS as COMPARE_COLUMNS
from magpie.traces.compare import comparison as compare_sides
from magpie.traces.gap import COLUMNS as GAP_COLUMNS
from magpie.traces.gap import Window, gap_rows
from magpie.traces.ingest import Trace, TraceError, collector_paused, load_trace
from magpie.traces.ops_tables import PERF_FAMILIES, table_columns
from magpie.traces.perf_rows import TraceCalls, trace_tables
from magpie.traces.report import _combined_top, _rank_label, trace_arch
from magpie.traces.roofline_table import COLUMNS as ROOFLINE_COLUMNS
from magpie.traces.roofline_table import roofline_rows
from magpie.traces.timeline import COLUMNS as TIMELINE_COLUMNS
from magpie.traces.timeline import gpu_timeline

if TYPE_CHECKING:
    import pandas


def _frame(rows: list[dict], columns: list[str]) -> pandas.DataFrame:
    try:
        import pandas
    except ImportError:
        raise UserError("magpie.traces: the DataFrame API needs pandas: pip install 'magpie[traces]'") from None
    return pandas.DataFrame(rows, columns=columns)


def _trace_error(path, err: TraceError) -> UserError:
    return UserError(str(err) if str(path) in str(err) else f"{path}: {err}")


class TraceAnalysis:
    """One parsed trace. Its tables are made on first use and kept; each method returns a new
    DataFrame of them."""

    def __init__(self, trace: Trace, arch_name: str | None = None) -> None:
        self.trace = trace
        self.arch = trace_arch(trace, arch_name)
        self.path = trace.path

    def __repr__(self) -> str:
        return f"TraceAnalysis({self.path!r}, device={self.trace.device_name()!r}, kernels={len(self.trace.kernels)})"

    @cached_property
    def _tables(self) -> tuple[list, dict[str, list[dict]]]:
        with collector_paused():
            return trace_tables(self.trace, self.arch, calls=TraceCalls.of(self.trace))

    def _table(self, name: str) -> pandas.DataFrame:
        rows = self._tables[1][name]
        return _frame(rows, table_columns(name, rows))

    def ops_summary(self) -> pandas.DataFrame:
        """TraceLens's ops_summary: GPU time per op name."""
        return self._table("ops_summary")

    def ops_summary_by_category(self) -> pandas.DataFrame:
        return self._table("ops_summary_by_category")

    def ops_unique_args(self) -> pandas.DataFrame:
        """GPU time per op name and arguments (dims, types, strides, concrete inputs)."""
        return self._table("ops_unique_args")

    def unified_perf_summary(self) -> pandas.DataFrame:
        """The perf rows: each op's FLOPs, bytes, time statistics and roofline."""
        return self._table("unified_perf_summary")

    def perf_families(self) -> list[str]:
        """The family sheets this trace has rows for (those the CLI writes)."""
        return [family for family in PERF_FAMILIES if self._tables[1][family]]

    def perf_table(self, family: str) -> pandas.DataFrame:
        """One family sheet (GEMM, CONV_fwd, SDPA_fwd, ..., see `perf_families`), grouped by model parameters."""
        if family not in PERF_FAMILIES:
            raise UserError(f"perf_table: unknown family {family!r} (known: {', '.join(PERF_FAMILIES)})")
        return self._table(family)

    def kernel_roofline(self) -> pandas.DataFrame:
        """<label>_kernel_roofline_simple.csv: each op signature against the device's roofline."""
        return _frame(roofline_rows(self._tables[0], self.arch), ROOFLINE_COLUMNS)

    def gap_analysis(self, top_k: int = 20, start_pct: float = 0.0, end_pct: float = 100.0) -> pandas.DataFrame:
        """gap_analysis.csv: the top kernels by total time in the window [start_pct, end_pct] of the GPU span."""
        if not 0 <= start_pct < end_pct <= 100:
            raise UserError("gap_analysis: need 0 <= start_pct < end_pct <= 100")
        rank = _rank_label(self.trace, 0)
        rows = gap_rows(self.trace, Window(start_pct, end_pct), rank_label=rank)
        return _frame(_combined_top({rank: rows}, top_k, {rank: Path(self.path).name}), GAP_COLUMNS)

    def timeline(self, device: int | None = None) -> pandas.DataFrame:
        """gpu_timeline.csv: busy, computation, communication, memcpy and idle time of a device
        (the trace's only one unless `device` names one)."""
        devices = gpu_timeline(self.trace)
        if device is None and len(devices) > 1:
            raise UserError(f"timeline: the trace ran on devices {', '.join(map(str, devices))}: pass device=")
        if device is not None and device not in devices:
            raise UserError(f"timeline: no device {device} in the trace (it has {', '.join(map(str, devices))})")
        rows = devices[device] if device is not None else next(iter(devices.values()), [])
        return _frame(rows, TIMELINE_COLUMNS)

    def collectives(self) -> pandas.DataFrame:
        """coll_analysis.csv: NCCL/RCCL kernels grouped by collective (empty without any)."""
        return _frame(
            coll_analysis(self.trace, _rank_label(self.trace, 0)) if self.trace.collectives else [], COLL_COLUMNS
        )


def open(path: str | Path, arch: str | None = None) -> TraceAnalysis:
    """Parse one PyTorch profiler trace (.json or .json.gz). `arch` names the device whose peaks
    the rooflines use where the trace does not record its own."""
    if arch is not None:
        from magpie.roofline.specs import ARCHES, lookup

        if lookup(arch) is None:
            raise UserError(f"arch: unknown accelerator {arch!r} (known: {', '.join(a.name for a in ARCHES)})")
    if not Path(path).is_file():
        raise UserError(f"{path}: no such trace file (give a PyTorch profiler trace, .json or .json.gz)")
    try:
        return TraceAnalysis(load_trace(path), arch)
    except TraceError as err:
        raise _trace_error(path, err) from None


class TraceComparison:
    """Two sets of traces compared; `summary` holds totals, counts per verdict and the rule."""

    def __init__(self, summary: dict) -> None:
        self.summary = summary
        self.warnings: list[str] = summary["warnings"]

    def table(self) -> pandas.DataFrame:
        """trace_compare.csv: the op rows, then the kernel rows (a `level` column tells them apart)."""
        return _frame(self.summary["ops"] + self.summary["kernels"], COMPARE_COLUMNS)

    def ops(self) -> pandas.DataFrame:
        return _frame(self.summary["ops"], COMPARE_COLUMNS)

    def kernels(self) -> pandas.DataFrame:
        return _frame(self.summary["kernels"], COMPARE_COLUMNS)


def comparison(before, after) -> TraceComparison:
    """`--compare-traces BEFORE AFTER` as DataFrames. Each side is a trace file, a folder of
    traces, or a list of either: repeats of one configuration."""
    sides = [",".join(map(str, side)) if isinstance(side, (list, tuple)) else str(side) for side in (before, after)]
    try:
        with collector_paused():
            return TraceComparison(compare_sides(*sides))
    except TraceError as err:
        raise UserError(f"comparison: {err}") from None
