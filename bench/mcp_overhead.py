"""What the MCP server costs an agent (issue 41.7), on a relu2 project of the test fixtures:

1. start: `magpie mcp` launched over stdio by the SDK's client until its first answer (the
   handshake and a tools/list), each in a fresh process;
2. per call: the round trip of a cheap tool (job_list, on a project with one job), median of
   many calls on one server (target: at most 10 ms), interleaved in blocks of 10 with the same
   loop against the SDK's own floor: a one-tool MCPServer whose tool returns a constant;
3. edit to verdict: one candidate's source changed and judged again, through MCP
   (write_candidate, build wait=true, get_report) against the CLI (the file written, `magpie
   build` run, its published compare_report.json read), alternated, each side the same edits;
4. trace work: gap_analysis of the H200 fixture traces (all of tests/fixtures/traces/h200) as a
   job through MCP (wait=true) against the same analysis run inline in this process (what the
   tool did before it was a job), alternated.

Usage: python bench/mcp_overhead.py [--starts 5] [--calls 200] [--edits 5] [--traces 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from anyio.from_thread import start_blocking_portal
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from conftest import FIXTURES, relu2_project  # noqa: E402

TIMING = "warmup_ms = 1\nbudget_ms = 10\nrounds = 2"


def server_of(root: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "magpie", "mcp"], cwd=str(root))


def source(edit: int) -> str:
    """The candidate's source at one edit: the same kernel, a different file (its tasks' keys change)."""
    return (FIXTURES / "adversarial/good.py").read_text() + f"\n# edit {edit}\n"


async def first_answer(root: Path) -> float:
    start = time.perf_counter()
    async with Client(server_of(root)) as client:
        await client.list_tools()
        return time.perf_counter() - start


FLOOR_SERVER = """
from pydantic import BaseModel
from mcp.server.mcpserver import MCPServer

app = MCPServer("floor", log_level="WARNING")


class Answer(BaseModel):
    jobs: list[str]


@app.tool()
def constant() -> Answer:
    \"\"\"A constant.\"\"\"
    return Answer(jobs=[])


app.run()
"""


def summary(values: list[float], unit: float = 1.0) -> dict:
    scaled = sorted(v * unit for v in values)
    return {"median": statistics.median(scaled), "min": scaled[0], "max": scaled[-1], "n": len(scaled)}


def cli_build(root: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "magpie", "build"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"magpie build failed in {root}:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--traces", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        mcp_root, cli_root = Path(folder, "mcp"), Path(folder, "cli")
        for root in (mcp_root, cli_root):
            root.mkdir()
            (root / "fast.py").write_text(source(0))
            relu2_project(root, ["fast"], "[[8, 16]]", defaults="trials = 1", timing=TIMING)
        shutil.copytree(FIXTURES / "traces/h200", mcp_root / "traces", ignore=shutil.ignore_patterns("*.json"))
        cli_build(cli_root)
        starts = [anyio.run(first_answer, mcp_root) for _ in range(args.starts)]
        floor = StdioServerParameters(command=sys.executable, args=["-c", FLOOR_SERVER], cwd=folder)
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(Client(server_of(mcp_root))) as client,
            portal.wrap_async_context_manager(Client(floor)) as floor_client,
        ):

            def call(name: str, arguments: dict | None = None, on=client) -> dict:
                result = portal.call(functools.partial(on.call_tool, name, arguments or {}))
                assert not result.is_error, result.content[0].text
                return result.structured_content

            call("build", {"wait": True})  # the same starting point as the CLI's project
            calls: list[float] = []
            floor_calls: list[float] = []
            for block in range(args.calls // 10 + 1):
                for name, on, into in (("job_list", client, calls), ("constant", floor_client, floor_calls)):
                    for _ in range(10):
                        start = time.perf_counter()
                        call(name, on=on)
                        if block:  # the first block warms both up
                            into.append(time.perf_counter() - start)
            through_mcp, through_cli = [], []
            for edit in range(1, args.edits + 1):
                start = time.perf_counter()
                call("write_candidate", {"kernel": "relu2", "candidate": "fast", "code": source(edit)})
                job = call("build", {"wait": True})
                (kernel,) = call("get_report", {"kernel": "relu2"})["kernels"]
                through_mcp.append(time.perf_counter() - start)
                assert job["state"] == "succeeded" and kernel["implementations"]

                start = time.perf_counter()
                (cli_root / "fast.py").write_text(source(edit))
                cli_build(cli_root)
                report = json.loads((cli_root / "workspaces/reports/relu2/compare_report.json").read_text())
                through_cli.append(time.perf_counter() - start)
                assert report["results"]
            from magpie.traces.report import analyze_traces

            trace_job, trace_inline = [], []
            for run in range(args.traces):
                start = time.perf_counter()
                job = call("gap_analysis", {"trace_dir": "traces", "wait": True})
                trace_job.append(time.perf_counter() - start)
                assert job["state"] == "succeeded" and job["result"]["top"], job
                start = time.perf_counter()
                analyze_traces(mcp_root / "traces", Path(folder, f"inline-{run}"), top_k=20)
                trace_inline.append(time.perf_counter() - start)
    figures = {
        "start_to_first_answer_s": summary(starts),
        "cheap_call_ms": summary(calls, 1000),
        "sdk_floor_call_ms": summary(floor_calls, 1000),
        "edit_to_verdict_mcp_s": summary(through_mcp),
        "edit_to_verdict_cli_s": summary(through_cli),
        "mcp_over_cli": statistics.median(through_mcp) / statistics.median(through_cli),
        "gap_analysis_job_s": summary(trace_job),
        "gap_analysis_inline_s": summary(trace_inline),
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
