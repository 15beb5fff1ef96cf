"""One job's process (`python -m magpie.mcp.worker JOB_FOLDER`): reads the request the server
wrote, runs it through magpie's library API, and records its state as it goes and its result
at the end (jobs.py reads them). It is the subreaper of everything it starts, so a process
that leaves its parent stays in the job's tree, where a cancel finds it.

`python -m magpie.mcp.worker --gpu-info` prints the device description as JSON: torch is
imported by that process, never by the server's."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from magpie.errors import UserError
from magpie.execution.progress import Progress
from magpie.mcp.jobs import REQUEST, RESULT, STATE, read_json, write_json

PR_SET_CHILD_SUBREAPER = 36


class JobProgress(Progress):
    """The build's progress lines as the job's state: the step running and how many are done."""

    def __init__(self, folder: Path, total: int | None = None):
        super().__init__(None)
        self.folder = folder
        self.state: dict[str, Any] = {
            "state": "running",
            "step": "starting",
            "done": 0,
            "total": total,
            "started": time.time(),
        }
        self.record()

    def record(self, **changes) -> None:
        self.state.update(changes)
        write_json(self.folder / STATE, self.state)

    def line(self, text: str) -> None:
        word = text[:6]
        if word == "run   ":
            self.record(step=text[6:].split("  ")[0])
        elif word in ("done  ", "FAIL  "):
            self.record(done=self.state["done"] + 1)
        elif text.startswith("magpie: "):
            self.record(step=text[8:])


def run_build(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.execution.build import Build, BuildOptions

    options = BuildOptions(
        manifest=root / "magpie.toml",
        targets=params.get("targets") or [],
        jobs=params.get("jobs", 1),
        force=params.get("force", False),
        verify=params.get("verify", False),
        summarize=True,
    )
    progress.record(step="planning", total=len(Build(options).dry_run().would_run))
    result = Build(options, progress).run()
    summary = result.summary
    return {
        "line": result.line,
        "exit_code": result.exit_code,
        "executed": result.executed,
        "failures": [{"task": task, "error": error} for task, error in result.failures],
        "summary": summary.model_dump(mode="json") if summary is not None else None,
    }


def _one_shot_options(params: dict, folder: Path):
    from magpie.execution.oneshot import OneShotOptions

    fields = ("paths", "type", "entry", "spec", "shapes", "dtypes", "rtol", "atol", "no_perf", "budget_ms", "device")
    return OneShotOptions(**{k: params[k] for k in fields if params.get(k) is not None}, output_dir=folder / "out")


def run_analyze(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.execution.oneshot import analyze

    return analyze(_one_shot_options(params, progress.folder), progress).report


def run_compare(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.execution.oneshot import compare

    return compare(_one_shot_options(params, progress.folder), params.get("baseline", 0), progress).report


def run_benchmark(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.serving.report import BenchmarkConfig
    from magpie.serving.runner import run_benchmark as serve

    config = BenchmarkConfig(**params["config"])
    progress.record(step=f"benchmarking {config.framework} {config.model}")
    return serve(config, project=str(root)).model_dump(mode="json")


def files_written(root: Path, outputs: dict) -> dict[str, str]:
    return {name: os.path.relpath(path, root) for name, path in outputs.items() if isinstance(path, str)}


def run_gap_analysis(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.mcp.models import TraceAnalysis
    from magpie.traces.gap import Window
    from magpie.traces.ingest import TraceError
    from magpie.traces.report import analyze_traces

    out = progress.folder / "out"
    progress.record(step=f"analyzing {os.path.relpath(params['trace_dir'], root)}")
    try:
        summary = analyze_traces(
            params["trace_dir"],
            out,
            top_k=params["top_k"],
            window=Window(params["start_pct"], params["end_pct"]),
            source_repos=params["kernel_source_repos"] or None,
            steady_state=params["steady_state"],
            analysis_mode=params["analysis_mode"],
        )
    except TraceError as err:
        raise UserError(f"trace_dir: {err}") from None
    outputs = {
        **files_written(root, summary["outputs"]),
        "json": os.path.relpath(out / "gap_analysis" / "gap_analysis.json", root),
    }
    return TraceAnalysis(
        traces=summary["traces"],
        total_kernel_time_us=summary["total_kernel_time_us"],
        top=summary["top"],
        warnings=summary["warnings"],
        outputs=outputs,
    ).model_dump(mode="json")


def run_compare_traces(root: Path, params: dict, progress: JobProgress) -> dict:
    from magpie.traces.compare import compare_traces
    from magpie.traces.ingest import TraceError

    progress.record(
        step=f"comparing {os.path.relpath(params['before'], root)} with {os.path.relpath(params['after'], root)}"
    )
    try:
        summary = compare_traces(params["before"], params["after"], progress.folder / "out")
    except TraceError as err:
        raise UserError(str(err)) from None
    return {"summary": summary, "outputs": files_written(root, summary.pop("outputs"))}


RUNNERS = {
    "build": run_build,
    "analyze": run_analyze,
    "compare": run_compare,
    "benchmark": run_benchmark,
    "gap_analysis": run_gap_analysis,
    "compare_traces": run_compare_traces,
}


def take_signing_secret() -> None:
    """The server's CI signing secret, if it passes one on stdin (jobs.py), held as the CLI holds
    its own: in this process's memory alone. Through the environment for the one call that reads
    it there and takes it out again at once, before this process starts any other. Stdin is then
    /dev/null: nothing started below reads the pipe."""
    import os

    from magpie.environment import SIGNING_KEY
    from magpie.store.signing import take_secret_from_environment

    passed = sys.stdin.buffer.read().decode(errors="replace").strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if passed:
        os.environ[SIGNING_KEY] = passed
        take_secret_from_environment()


def main(folder: Path) -> int:
    from magpie.linux.namespaces import prctl

    take_signing_secret()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    request = read_json(folder / REQUEST) or {}
    progress = JobProgress(folder)
    root = Path.cwd()
    try:
        result = RUNNERS[request["kind"]](root, request.get("params", {}), progress)
    except UserError as err:
        progress.record(state="failed", error=str(err), finished=time.time())
        return 2
    except BaseException as err:  # noqa: BLE001 - any end is recorded; the traceback goes to the job's log
        traceback.print_exc()
        line = (str(err).strip().splitlines() or [""])[-1]
        progress.record(state="failed", error=f"{type(err).__name__}: {line}".rstrip(": "), finished=time.time())
        return 1
    write_json(folder / RESULT, result)
    progress.record(state="succeeded", step="finished", finished=time.time())
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--gpu-info"]:
        import json

        from magpie.cli.gpu_info import collect

        print(json.dumps(collect()))
        sys.exit(0)
    sys.exit(main(Path(sys.argv[1])))
