"""bench/serving_client.py (issue 40.9) measures a bare-asyncio floor in the same run as magpie's client and reports
magpie's req/s and TTFT as ratios to it, per round against that round's floor: what holds on a busy machine."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "serving_client.py"


def test_the_client_bench_reports_ratios_to_a_floor_measured_beside_it(tmp_path):
    out = tmp_path / "client.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "300", "--rate-requests", "30", "--rounds", "2"]
        + ["--concurrency", "8", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(out.read_text())
    rows = facts["rows"]
    assert {r["design"] for r in rows} >= {"floor", "magpie"} and {r["round"] for r in rows} == {0, 1}
    assert all(r["completed"] == r["requests"] and r["failed"] == 0 for r in rows)
    assert len(facts["load_average_before"]) == 3
    summary = {(s["design"], s["load"]): s for s in facts["summary"]}
    for load in {r["load"] for r in rows}:
        floors = {r["round"]: r for r in rows if r["design"] == "floor" and r["load"] == load}
        mine = [r for r in rows if r["design"] == "magpie" and r["load"] == load]
        ratios = [r["req_per_s"] / floors[r["round"]]["req_per_s"] for r in mine]
        added = [r["ttft_ms"]["p99"] - floors[r["round"]]["ttft_ms"]["p99"] for r in mine]
        row = summary[("magpie", load)]
        assert row["req_per_s_over_floor"]["median"] == round(statistics.median(ratios), 3)
        assert row["ttft_p99_added_ms"]["median"] == round(statistics.median(added), 3)
        assert f"| {load}" in proc.stdout
    assert "x floor" in proc.stdout and "TTFT median " in proc.stdout
