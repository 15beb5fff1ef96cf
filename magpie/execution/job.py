"""A job: one task's work, as plain data in and plain data out.

Jobs carry their dependencies' results with them and return their files as bytes, so
they can run in this process, in a local process pool, or on a remote worker, and the
store is written only by the process that owns it.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from magpie.execution.relative_paths import ProjectPaths
from magpie.graph.expand import TaskSpec
from magpie.supervision import scratch as scratch_folders

# Built-in actions by name, imported only when a task of theirs runs.
ACTIONS = {
    "compile_python": "magpie.execution.actions:compile_python",
    "correctness": "magpie.execution.actions:correctness",
    "timing": "magpie.execution.actions:timing",
    "comparison": "magpie.execution.actions:comparison",
    "profile": "magpie.execution.profile:profile",
    "report": "magpie.execution.report_action:report",
    "trace_analysis": "magpie.traces.report:trace_analysis_rule",
    "serving_benchmark": "magpie.serving.build_rule:benchmark_rule",
    "serving_profile": "magpie.serving.build_rule:profile_rule",
    "serving_trace_analysis": "magpie.serving.build_rule:trace_analysis_rule",
    "serving_sweep": "magpie.serving.build_rule:sweep_rule",
    "serving_ab": "magpie.serving.ab:ab_rule",
}
COMMAND_ACTION = "magpie.execution.actions:command"


@dataclass
class Job:
    spec: TaskSpec
    dep_results: dict[str, dict]
    dep_dirs: dict[str, str]
    input_secret: str = ""  # the build's, mixed into every input seed (harness/spec.py); "" where none


@dataclass
class JobOutput:
    result: dict
    files: dict[str, bytes]
    seconds: float


def resolve_action(spec: TaskSpec):
    name = spec.action[len("magpie:") :] if spec.is_builtin else None
    if name is not None and name not in ACTIONS:
        raise KeyError(f"unknown built-in action magpie:{name} (known: {', '.join(ACTIONS)})")
    module_name, attr = (ACTIONS[name] if name else COMMAND_ACTION).split(":")
    return getattr(importlib.import_module(module_name), attr)


def run_job(job: Job) -> JobOutput:
    started_unix = time.time()  # where the task sat in the build's timeline
    started = time.monotonic()
    action = resolve_action(job.spec)
    folder = scratch_folders.make("job-")  # the next build's sweep removes it if this process is killed
    try:
        out_dir = folder / "out"
        out_dir.mkdir()
        result = action(job, out_dir)
        files = {p.relative_to(out_dir).as_posix(): p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}
    finally:
        scratch_folders.remove(folder)
    root = job.spec.params.get("root")
    if root:  # stored and published as the project names its files, not as this machine keeps them
        paths = ProjectPaths(root)
        result, files = paths.value(result), paths.files(files)
    seconds = time.monotonic() - started
    result.setdefault("task", job.spec.name)
    result["task_seconds"] = round(seconds, 3)
    result["task_started_unix"] = round(started_unix, 3)
    return JobOutput(result, files, seconds)
