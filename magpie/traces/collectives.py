"""TraceLens's collective analysis of one rank's trace (`coll_analysis.csv`): the collective
kernels (NCCL/RCCL) grouped by what PyTorch recorded of their collective (process group,
collective, group size, dtype, element counts and splits) and their stream, with the message
sizes in MiB and the statistics of the kernels' durations, most time first."""

from __future__ import annotations

import math
import statistics

from magpie.traces.ingest import COLLECTIVE_FIELDS, Trace
from magpie.traces.kernels import category
from magpie.traces.ops_tables import MIB
from magpie.traces.stats import sample_std

COLUMNS = [
    "rank",
    *COLLECTIVE_FIELDS,
    "stream",
    "In msg size (MB)_first",
    "Out msg size (MB)_first",
    "dur_sum",
    "dur_mean",
    "dur_std",
    "dur_min",
    "dur_max",
    "operation_count",
]
# TraceLens's element sizes; a dtype not named here has no message size
BYTES = {"Float": 4, "Int": 4, "Long": 8, "BFloat16": 2, "Bool": 1, "Byte": 1, "Double": 8, "Half": 2, "Short": 2}
_DTYPE, _IN, _OUT = (COLLECTIVE_FIELDS.index(f) for f in ("dtype", "In msg nelems", "Out msg nelems"))


def coll_analysis(trace: Trace, rank: str) -> list[dict]:
    """The rows of `coll_analysis.csv`, `rank` in the rank column. A kernel whose record misses a
    field is in no row, as TraceLens's grouping leaves it out."""
    durations: dict[tuple, list[float]] = {}
    for kernel, record in trace.collectives:
        if None not in record and category(kernel.name) == "communication":
            durations.setdefault((*record, kernel.stream), []).append(kernel.dur)
    rows = []
    for key, durs in durations.items():
        size = BYTES.get(key[_DTYPE])
        mean = statistics.fmean(durs)
        rows.append(
            {
                "rank": rank,
                **dict(zip(COLUMNS[1:], key)),
                "In msg size (MB)_first": key[_IN] * size / MIB if size else None,
                "Out msg size (MB)_first": key[_OUT] * size / MIB if size else None,
                "dur_sum": math.fsum(durs),
                "dur_mean": mean,
                "dur_std": sample_std(durs) if len(durs) > 1 else None,
                "dur_min": min(durs),
                "dur_max": max(durs),
                "operation_count": len(durs),
            }
        )
    rows.sort(key=lambda row: -row["dur_sum"])
    return rows
