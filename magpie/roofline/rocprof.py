"""rocprofv3 CSV outputs (kernel trace and counter collection) into per-kernel rows.

Built from rocprofv3's documented column names; not yet checked against a real AMD run.
"""

from __future__ import annotations

import csv
import io


def parse_rocprof(files: dict[str, str]) -> list[dict]:
    durations: dict[str, float] = {}
    for name, text in files.items():
        if "kernel_trace" in name:
            for row in csv.DictReader(io.StringIO(text)):
                kernel = row.get("Kernel_Name", "")
                ns = float(row.get("End_Timestamp", 0)) - float(row.get("Start_Timestamp", 0))
                durations[kernel] = durations.get(kernel, 0.0) + ns
    counters: dict[str, float] = {}
    for name, text in files.items():
        if "counter_collection" in name:
            for row in csv.DictReader(io.StringIO(text)):
                if row.get("Counter_Name") in ("FETCH_SIZE", "WRITE_SIZE"):
                    kernel = row.get("Kernel_Name", "")
                    counters[kernel] = counters.get(kernel, 0.0) + float(row.get("Counter_Value", 0)) * 1024
    return [{"name": k, "duration_us": ns / 1000, "dram_bytes": counters.get(k)} for k, ns in durations.items()]
