"""The MCP server (`magpie mcp`, issue 41) driven by the official SDK's client over stdio, as
an agent drives it: one server per module over a project holding a quick kernel (relu2), a
kernel whose candidate sleeps (to cancel), real H200 traces and benchmark reports, and a
source folder. Every tool's structured result is checked against its output schema; every
path argument's escape is refused."""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from anyio.from_thread import start_blocking_portal
from conftest import FIXTURES, copy_fixtures, kernel_table, project_toml
from mcp import Client, StdioServerParameters
from pydantic import BaseModel

from magpie.linux.procfs import child_pids, command_words, descendants, process_state

TIMING = "warmup_ms = 1\nbudget_ms = 10\nrounds = 2"
SLEEPS = "import time\n\n\ndef kernel(x):\n    time.sleep(120)\n    return x\n"
TRITON_SOURCE = "import triton\n\n\n@triton.jit\ndef rmsnorm_kernel(x_ptr):\n    pass\n"
TOOLS = {
    "project_status",
    "build",
    "clean",
    "verify",
    "get_report",
    "write_candidate",
    "analyze",
    "compare",
    "gpu_info",
    "gap_analysis",
    "find_kernel_sources",
    "compare_traces",
    "benchmark",
    "list_benchmark_results",
    "get_benchmark_result",
    "compare_benchmark_results",
    "job_status",
    "job_result",
    "job_cancel",
    "job_list",
}


class Session:
    """The SDK's Client in a thread of its own (a blocking portal), called synchronously."""

    def __init__(self, server):
        self._portal_context = start_blocking_portal()
        self.portal = self._portal_context.__enter__()
        self._client_context = self.portal.wrap_async_context_manager(Client(server, read_timeout_seconds=300))
        self.client = self._client_context.__enter__()

    def call(self, name: str, arguments: dict | None = None, progress=None):
        return self.portal.call(
            functools.partial(self.client.call_tool, name, arguments or {}, progress_callback=progress)
        )

    def ok(self, name: str, arguments: dict | None = None, progress=None) -> dict:
        result = self.call(name, arguments, progress)
        assert not result.is_error, result.content[0].text
        return result.structured_content

    def error(self, name: str, arguments: dict) -> str:
        result = self.call(name, arguments)
        assert result.is_error, f"{name}({arguments}) was not refused: {result.structured_content}"
        return result.content[0].text

    def __getattr__(self, method: str):
        return lambda *args: self.portal.call(getattr(self.client, method), *args)

    def close(self) -> None:
        self._client_context.__exit__(None, None, None)
        self._portal_context.__exit__(None, None, None)


def output_schema(session: Session, name: str) -> dict:
    return {tool.name: tool.output_schema for tool in session.list_tools().tools}[name]


def stdio_server(root: Path) -> Session:
    return Session(StdioServerParameters(command=sys.executable, args=["-m", "magpie", "mcp"], cwd=str(root)))


def make_project(root: Path) -> None:
    copy_fixtures(root, ["good", "spec"])
    (root / "sleeps.py").write_text(SLEEPS)
    quick = kernel_table("relu2", "good", shapes="[[8, 16]]", timing=TIMING)
    sleepy = kernel_table("sleepy", "good", ["sleeps"], shapes="[[8, 16]]", settings="timeout_s = 300", timing=TIMING)
    (root / "magpie.toml").write_text(project_toml(quick, sleepy, defaults="trials = 1"))
    traces = root / "traces"
    for side in ("before", "after"):
        (traces / side).mkdir(parents=True)
        shutil.copy(FIXTURES / "traces/h200/conv_bf16.json.gz", traces / side)
    (root / "repo").mkdir()
    (root / "repo/rmsnorm.py").write_text(TRITON_SOURCE)
    results = root / "workspaces/mcp/benchmarks"
    for name in ("clean-a", "clean-b"):
        shutil.copytree(FIXTURES / "serving/h200/clean", results / name)
    (root / "escape").symlink_to(root.parent)  # a symlink out of the project


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mcp") / "project"
    root.mkdir()
    make_project(root)
    return root


@pytest.fixture(scope="module")
def server(project):
    session = stdio_server(project)
    yield session
    session.close()


@pytest.fixture(scope="module")
def built(server):
    """A candidate written through the server, then the quick kernel built, waited for:
    (the write's result, the build's job, the progress notifications with their times, seconds)."""
    written = server.ok(
        "write_candidate",
        {"kernel": "relu2", "candidate": "fast", "code": (FIXTURES / "adversarial/good.py").read_text()},
    )
    notes: list[tuple[float, float, float | None, str | None]] = []

    async def noted(progress, total, message):
        notes.append((time.monotonic(), progress, total, message))

    start = time.monotonic()
    job = server.ok("build", {"targets": ["relu2"], "wait": True}, progress=noted)
    return written, job, notes, time.monotonic() - start, start


def test_every_tool_is_listed_with_its_schemas_and_annotations(server):
    tools = {tool.name: tool for tool in server.list_tools().tools}
    assert TOOLS <= set(tools)
    for tool in tools.values():
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.description, tool.name
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint is not None and hints.idempotent_hint is not None
        if not hints.read_only_hint:
            assert hints.destructive_hint is not None, tool.name
    assert tools["get_report"].annotations.read_only_hint
    assert tools["clean"].annotations.destructive_hint and not tools["clean"].annotations.read_only_hint
    assert not tools["build"].annotations.read_only_hint


def test_no_tool_takes_a_command(server):
    """Commands come only from the manifest: no tool has an argument that could carry one."""
    words = ("command", "cmd", "shell", "args", "testcase", "script", "exec", "env")
    for tool in server.list_tools().tools:
        for name in tool.input_schema.get("properties", {}):
            assert not any(word in name.lower() for word in words), f"{tool.name}.{name}"


@pytest.mark.slow  # a build through the server
def test_a_written_candidate_is_declared_built_and_judged(server, project, built):
    written, job, _, _, _ = built
    assert written == {
        "kernel": "relu2",
        "candidate": "fast",
        "source": "candidates/relu2/fast.py",
        "replaced": False,
        "bytes": len((FIXTURES / "adversarial/good.py").read_bytes()),
    }
    assert 'source = "candidates/relu2/fast.py"' in (project / "magpie.toml").read_text()
    assert (
        job["state"] == "succeeded" and job["done"] == job["total"] == 7
    )  # compile, correctness, timing of two; comparison; report
    assert job["result"]["exit_code"] == 0 and "compile:relu2/fast" in job["result"]["executed"]
    (kernel,) = server.ok("get_report", {"kernel": "relu2"})["kernels"]
    verdicts = {impl["implementation"]: impl for impl in kernel["implementations"]}
    assert verdicts["fast"]["correctness_state"] == "SUCCESS" and verdicts["fast"]["failure_kinds"] == []
    assert verdicts["fast"]["speedup"]["ci_low"] <= verdicts["fast"]["speedup"]["value"]
    assert kernel["timed_shapes"] == ["[8, 16] float32"] and kernel["timing_method"]
    assert verdicts["fast"]["clock_state"].startswith("clocks not read: ")  # the CPU has no GPU clocks to read
    # the same verdicts as a resource
    contents = server.read_resource("magpie://kernels/relu2/verdicts").contents[0].text
    assert json.loads(contents)["implementations"] == kernel["implementations"]


@pytest.mark.slow  # a build through the server
def test_progress_is_notified_at_least_once_a_second_while_a_waited_build_runs(built):
    _, job, notes, seconds, start = built
    assert seconds > 1 and len(notes) >= int(seconds) - 1
    times = [start] + [at for at, *_ in notes]
    assert max(b - a for a, b in zip(times, times[1:])) < 1.5  # one every 0.5 s, on a busy machine
    assert any(message and ":relu2/" in message for *_, message in notes)
    assert notes[-1][2] == 7  # the total, once planned


@pytest.mark.slow  # a build through the server
def test_every_output_schema_holds_for_a_real_result(server, project, built):
    _, build_job, _, _, _ = built
    schemas = {tool.name: tool.output_schema for tool in server.list_tools().tools}
    shapes = {"type": "pytorch", "entry": "kernel", "spec": "spec.py", "shapes": "8x16", "budget_ms": 10.0}
    results = {
        "project_status": server.ok("project_status"),
        "get_report": server.ok("get_report"),
        "verify": server.ok("verify"),
        "gpu_info": server.ok("gpu_info"),
        "job_list": server.ok("job_list"),
        "job_status": server.ok("job_status", {"job_id": build_job["job_id"]}),
        "job_result": server.ok("job_result", {"job_id": build_job["job_id"]}),
        "analyze": server.ok("analyze", {"source": "good.py", **shapes, "wait": True}),
        "compare": server.ok("compare", {"sources": ["good.py", "candidates/relu2/fast.py"], **shapes, "wait": True}),
        "gap_analysis": server.ok("gap_analysis", {"trace_dir": "traces/before", "top_k": 5, "wait": True}),
        "compare_traces": server.ok(
            "compare_traces", {"before": "traces/before", "after": "traces/after", "wait": True}
        ),
        "find_kernel_sources": server.ok(
            "find_kernel_sources", {"kernels": ["rmsnorm_kernel", "void gemm<float>(float*)"], "repos": ["repo"]}
        ),
        "list_benchmark_results": server.ok("list_benchmark_results"),
        "get_benchmark_result": server.ok("get_benchmark_result", {"result_id": "clean-a"}),
        "compare_benchmark_results": server.ok("compare_benchmark_results", {"before": "clean-a", "after": "clean-b"}),
        "write_candidate": server.ok(
            "write_candidate",
            {"kernel": "relu2", "candidate": "fast", "code": "# replaced\n" + (project / "good.py").read_text()},
        ),
        "clean": server.ok("clean", {"kernels": ["relu2"]}),
        "build": build_job,
    }
    # job_cancel's and benchmark's real results are checked where they are made (below)
    assert set(results) | {"job_cancel", "benchmark"} == TOOLS
    for name, result in results.items():
        jsonschema.validate(result, schemas[name])
    assert results["analyze"]["result"]["correctness_state"] == "SUCCESS"
    assert results["compare"]["state"] == "succeeded" and results["compare"]["result"]["baseline"] == "good"
    assert results["project_status"]["kernels"] == ["relu2", "sleepy"]
    assert results["write_candidate"]["replaced"] and results["clean"]["removed"] > 0
    found = {k["kernel"]: k for k in results["find_kernel_sources"]["kernels"]}
    assert found["rmsnorm_kernel"]["state"] == "resolved" and found["rmsnorm_kernel"]["file"] == "repo/rmsnorm.py"
    analysis = results["gap_analysis"]["result"]
    assert analysis["top"] and analysis["total_kernel_time_us"] > 0
    assert results["compare_traces"]["state"] == "succeeded" and results["compare_traces"]["result"]["summary"]
    assert [r["result_id"] for r in results["list_benchmark_results"]["results"]] == ["clean-a", "clean-b"]
    assert results["verify"]["bad"] == []
    stale = {task["task"]: task["why"] for task in server.ok("project_status")["stale"]}
    assert "compile:relu2/fast" in stale  # cleaned, and its source replaced


def test_large_results_come_as_resource_links(server):
    result = server.call("gap_analysis", {"trace_dir": "traces/before", "wait": True})
    (link,) = [block for block in result.content if block.type == "resource_link"]
    assert link.uri.startswith("magpie://workspace/mcp/jobs/") and link.uri.endswith("gap_analysis.json")
    whole = json.loads(server.read_resource(link.uri).contents[0].text)
    assert whole["top"]


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("gap_analysis", {"trace_dir": "traces/before", "top_k": 3}),
        ("compare_traces", {"before": "traces/before", "after": "traces/after"}),
    ],
)
def test_trace_work_is_a_job_answered_at_once_then_followed_to_its_result(server, project, name, arguments):
    """A big trace takes minutes to read: the call returns a job at once, which job_status follows (job_cancel
    stops it as any job)."""
    job = server.ok(name, arguments)
    assert job["kind"] == name and job["state"] == "running" and job["result"] is None
    deadline = time.monotonic() + 120
    while server.ok("job_status", {"job_id": job["job_id"]})["state"] == "running":
        assert time.monotonic() < deadline, f"{name} did not end within 120 s"
        time.sleep(0.1)
    done = server.ok("job_result", {"job_id": job["job_id"]})
    assert done["state"] == "succeeded", done
    assert done["result"]["outputs"]["json"].startswith(f"workspaces/mcp/jobs/{job['job_id']}/out/")
    if name == "gap_analysis":
        assert 0 < len(done["result"]["top"]) <= 3


def test_an_unreadable_trace_fails_its_job_in_one_line(server, project):
    (project / "traces/unreadable").mkdir(exist_ok=True)
    (project / "traces/unreadable/bad.json").write_text("{not a trace")
    job = server.ok("gap_analysis", {"trace_dir": "traces/unreadable", "wait": True})
    assert job["state"] == "failed" and job["error"].startswith("trace_dir: ") and "\n" not in job["error"], job


@pytest.mark.slow  # a build through the server
def test_a_cancelled_job_takes_its_whole_process_tree_within_a_second(server, project):
    job = server.ok("build", {"targets": ["sleepy"]})
    assert job["state"] == "running"  # answered at once
    folder = project / "workspaces/mcp/jobs" / job["job_id"]
    pid = json.loads((folder / "process.json").read_text())["pid"]
    deadline = time.monotonic() + 120
    while "correctness:sleepy/sleeps" not in (server.ok("job_status", {"job_id": job["job_id"]})["step"] or ""):
        assert time.monotonic() < deadline, "the sleeping candidate's correctness never started"
        time.sleep(0.2)
    time.sleep(1)  # its sandboxed worker asleep in the kernel
    tree = [pid, *descendants(pid)]
    assert len(tree) >= 3  # the job, its evaluator, the sandbox's worker at least
    assert "build job" in server.error("clean", {"everything": True})  # not under a running build
    start = time.monotonic()
    cancelled = server.ok("job_cancel", {"job_id": job["job_id"]})
    took = time.monotonic() - start
    assert cancelled["state"] == "cancelled"
    jsonschema.validate(cancelled, output_schema(server, "job_cancel"))
    alive = [p for p in tree if process_state(p) not in (None, "Z", "X")]  # a zombie is gone but for its reaping
    assert alive == [] and took < 1.0, (alive, took)
    assert server.ok("job_status", {"job_id": job["job_id"]})["state"] == "cancelled"


@pytest.mark.slow  # a build through the server
def test_a_finished_job_leaves_no_zombie_behind(server, built):
    server.ok("job_list")  # the server looks at its jobs: those that ended are waited for
    servers = [pid for pid in descendants(os.getpid()) if command_words(pid)[-2:] == [b"magpie", b"mcp"]]
    assert servers
    for pid in servers:
        assert [child for child in child_pids(pid) if process_state(child) == "Z"] == []


@pytest.mark.slow  # a build through the server
def test_a_restarted_server_answers_for_the_jobs_an_earlier_one_started(project, built):
    _, job, _, _, _ = built
    again = stdio_server(project)
    try:
        listed = {j["job_id"]: j["state"] for j in again.ok("job_list")["jobs"]}
        assert listed[job["job_id"]] == "succeeded"
        assert again.ok("job_result", {"job_id": job["job_id"]})["result"] == job["result"]
    finally:
        again.close()


CI_SECRET = "c1" * 32  # a CI signing secret, given to the server's environment
# one kernel whose testcase fails wherever the signing secret or the HTTP token reached code under test, or
# where it ran outside the sandbox (there no socket can be made)
SECRET_PROJECT = """
[project]
name = "signed"

[[kernel]]
id = "k"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "base"
source = "base.py"

[[kernel.candidates]]
id = "c"
source = "c.py"

[[kernel.testcases]]
command = 'test -z "$MAGPIE_SIGNING_KEY$MAGPIE_MCP_TOKEN" && ! python -c "import socket; socket.socket()"'
"""


@pytest.mark.slow  # a build through the server
def test_jobs_sign_with_the_servers_ci_secret_which_code_under_test_never_sees(tmp_path):
    """A server started in CI with MAGPIE_SIGNING_KEY: its jobs' artifacts are signed with that
    secret (not a key file of the machine's), so verify in the server and a CLI build of the same
    CI trust them; the secret is in no job file and reaches no code under test."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    root, config = tmp_path / "project", tmp_path / "config"
    root.mkdir()
    (root / "magpie.toml").write_text(SECRET_PROJECT)
    for name in ("base", "c"):
        (root / f"{name}.py").write_text("def kernel(x):\n    return x\n")
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(config),
        "MAGPIE_SIGNING_KEY": CI_SECRET,
        "MAGPIE_MCP_TOKEN": "a-token-the-jobs-must-not-see-0123456789",
    }
    session = Session(
        StdioServerParameters(command=sys.executable, args=["-m", "magpie", "mcp"], cwd=str(root), env=env)
    )
    try:
        job = session.ok("build", {"wait": True})
        assert job["state"] == "succeeded" and job["result"]["exit_code"] == 0, job
        (kernel,) = session.ok("get_report")["kernels"]
        assert {row["implementation"]: row["correctness_state"] for row in kernel["implementations"]} == {
            "base": "SUCCESS",
            "c": "SUCCESS",
        }  # neither the secret nor the token in any testcase's environment, each run sandboxed
        assert session.ok("verify") == {"checked": len(job["result"]["executed"]), "bad": [], "removed": False}
    finally:
        session.close()
    public = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(CI_SECRET)).public_key()
    signer = "ed25519:" + public.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    signatures = list((root / "workspaces/store").glob("*/*/.signature.json"))
    assert signatures and {json.loads(path.read_text())["signer"] for path in signatures} == {signer}
    assert not (config / "magpie/signing-key").exists()  # no machine key made in its place
    for path in (root / "workspaces/mcp/jobs").rglob("*"):
        assert not path.is_file() or CI_SECRET.encode() not in path.read_bytes(), path


@pytest.mark.slow  # a real engine started
def test_a_benchmark_job_is_a_measurement_and_its_result_is_listed_and_compared(tmp_path, tiny_model):
    """transformers serve on the CPU, the tiny model copied into a project of its own, benchmarked through MCP."""
    from magpie.serving.local import free_port

    root = tmp_path / "project"
    root.mkdir()
    make_project(root)
    shutil.copytree(tiny_model, root / "model")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    session = Session(
        StdioServerParameters(command=sys.executable, args=["-m", "magpie", "mcp"], cwd=str(root), env=env)
    )
    try:
        load = {"engine": "transformers", "model": "model", "num_prompts": 4, "input_len": 16, "output_len": 8}
        job = session.ok("benchmark", {**load, "concurrency": 2, "port": free_port(), "timeout_s": 300, "wait": True})
        assert job["state"] == "succeeded", job
        jsonschema.validate(job, output_schema(session, "benchmark"))
        report = job["result"]
        assert report["success"] and report["config"]["run_kind"] == "measurement" and not report["config"]["profiler"]
        assert report["run"]["completed"] == 4
        results = session.ok("list_benchmark_results")["results"]
        mine = [r for r in results if r["result_id"] not in ("clean-a", "clean-b")]
        assert len(mine) == 1 and mine[0]["success"] and mine[0]["framework"] == "transformers"
        got = session.ok("get_benchmark_result", {"result_id": mine[0]["result_id"]})
        assert got == mine[0]
        compared = session.ok("compare_benchmark_results", {"before": got["result_id"], "after": got["result_id"]})
        assert compared["comparison"]
    finally:
        session.close()


@pytest.mark.gpu
def test_a_candidate_written_through_mcp_is_judged_on_the_gpu(tmp_path):
    """On a GPU: gpu_info names it, and a candidate written and built through the server is judged there."""
    root = tmp_path / "project"
    root.mkdir()
    copy_fixtures(root, ["good", "spec"])
    table = kernel_table("relu2", "good", shapes="[[4096, 4096]]", timing="warmup_ms = 5\nbudget_ms = 50\nrounds = 3")
    (root / "magpie.toml").write_text(project_toml(table, device="cuda"))
    session = stdio_server(root)
    try:
        assert session.ok("gpu_info")["gpus"]
        code = (FIXTURES / "adversarial/good.py").read_text()
        session.ok("write_candidate", {"kernel": "relu2", "candidate": "fast", "code": code})
        job = session.ok("build", {"wait": True})
        assert job["state"] == "succeeded" and job["result"]["exit_code"] == 0, job
        (kernel,) = session.ok("get_report")["kernels"]
        verdicts = {impl["implementation"]: impl for impl in kernel["implementations"]}
        assert verdicts["fast"]["correctness_state"] == "SUCCESS" and verdicts["fast"]["median_us"] > 0
        assert kernel["timing_method"] and kernel["timed_shapes"] == ["[4096, 4096] float32"]
        assert verdicts["fast"]["clocks"]["readings"] > 0 and "MHz" in verdicts["fast"]["clock_state"]
    finally:
        session.close()


OUTSIDE = ["../outside.py", "/etc/passwd", "escape/x.py", "sub/../../x.py", "a\0b", "~/x.py"]


@pytest.mark.parametrize("attack", OUTSIDE)
def test_every_path_argument_is_confined_to_the_project(server, project, attack):
    shapes = {"type": "pytorch", "shapes": "8x16"}
    calls = [
        ("write_candidate", {"kernel": "relu2", "candidate": "evil", "code": "x = 1\n", "source": attack}),
        ("analyze", {"source": attack, "spec": "spec.py", **shapes}),
        ("analyze", {"source": "good.py", "spec": attack, **shapes}),
        ("compare", {"sources": ["good.py", attack], "spec": "spec.py", **shapes}),
        ("gap_analysis", {"trace_dir": attack}),
        ("gap_analysis", {"trace_dir": "traces/before", "kernel_source_repos": [attack]}),
        ("find_kernel_sources", {"kernels": ["k"], "repos": [attack]}),
        ("compare_traces", {"before": attack, "after": "traces/after"}),
        ("compare_traces", {"before": "traces/before", "after": attack}),
        ("benchmark", {"engine": "transformers", "model": attack}),
    ]
    for name, arguments in calls:
        text = server.error(name, arguments)
        assert "\n" not in text and "Traceback" not in text, text
        assert "outside the project" in text or "absolute" in text or "NUL" in text, (name, text)
    assert not (project.parent / "outside.py").exists() and not (project.parent / "x.py").exists()


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("job_status", {"job_id": "../../magpie.toml"}),
        ("job_result", {"job_id": "/etc"}),
        ("job_cancel", {"job_id": ".."}),
        ("get_report", {"kernel": "../../.."}),
        ("get_benchmark_result", {"result_id": "../benchmarks"}),
        ("compare_benchmark_results", {"before": "clean-a", "after": "../../../etc"}),
        ("write_candidate", {"kernel": "relu2", "candidate": "../evil", "code": "x"}),
        ("write_candidate", {"kernel": "relu2", "candidate": "good", "code": "x"}),  # the baseline
        ("write_candidate", {"kernel": "relu2", "candidate": "evil", "code": "x", "source": "spec.py"}),
        ("write_candidate", {"kernel": "relu2", "candidate": "evil", "code": "x", "source": "magpie.toml"}),
        ("write_candidate", {"kernel": "relu2", "candidate": "evil", "code": "x", "source": "workspaces/e.py"}),
        ("write_candidate", {"kernel": "relu2", "candidate": "evil", "code": "x", "source": ".git/hooks/pre-commit"}),
        ("compare_traces", {"before": "traces/before,/etc", "after": "traces/after"}),
        ("benchmark", {"engine": "transformers", "model": "owner/../name"}),
    ],
)
def test_ids_and_the_projects_own_files_are_refused(server, project, name, arguments):
    manifest = (project / "magpie.toml").read_text()
    spec = (project / "spec.py").read_text()
    text = server.error(name, arguments)
    assert "\n" not in text and "Traceback" not in text, text
    assert (project / "magpie.toml").read_text() == manifest and (project / "spec.py").read_text() == spec


@pytest.mark.parametrize("uri", ["magpie://workspace/../magpie.toml", "magpie://workspace/%2e%2e/%2e%2e/etc/passwd"])
def test_resources_serve_only_the_workspace(server, uri):
    with pytest.raises(Exception, match="(?i)no such file|traversal|not found|unknown|invalid"):
        server.read_resource(uri)


def test_resources_and_the_prompt(server, project):
    uris = {str(resource.uri) for resource in server.list_resources().resources}
    assert {"magpie://project/manifest", "magpie://project/report"} <= uris
    templates = {t.uri_template for t in server.list_resource_templates().resource_templates}
    assert "magpie://kernels/{kernel}/verdicts" in templates and "magpie://jobs/{job_id}/result" in templates
    assert server.read_resource("magpie://project/manifest").contents[0].text == (project / "magpie.toml").read_text()
    (prompt,) = [p for p in server.list_prompts().prompts if p.name == "optimize_kernel"]
    text = server.portal.call(server.client.get_prompt, "optimize_kernel", {"kernel": "relu2"}).messages[0].content.text
    for step in ("benchmark", "gap_analysis", "find_kernel_sources", "write_candidate", "compare", "re-benchmark"):
        assert step in text.lower()


class Slept(BaseModel):
    seconds: float


def test_a_synchronous_tool_notifies_progress_at_least_once_a_second_while_it_runs():
    """Not only waited-for jobs: a tool that answers inline (verify of a large store, project_status of a large
    project) sends a heartbeat while it runs. The server's own tool registration, an in-process client."""
    from mcp.server.mcpserver import MCPServer

    from magpie.mcp.server import annotated, tool

    app = MCPServer(name="heartbeat", log_level="WARNING")

    @tool(app, annotated(read_only=True, idempotent=True))
    def slow(seconds: float) -> Slept:
        """Sleeps."""
        time.sleep(seconds)
        return Slept(seconds=seconds)

    notes: list[float] = []

    async def noted(progress, total, message):
        notes.append(time.monotonic())

    session = Session(app)
    try:
        (listed,) = session.list_tools().tools
        assert set(listed.input_schema["properties"]) == {"seconds"}  # the heartbeat's context is no input
        start = time.monotonic()
        assert session.ok("slow", {"seconds": 2.2}, progress=noted) == {"seconds": 2.2}
        times = [start, *notes, time.monotonic()]
        assert len(notes) >= 3 and max(b - a for a, b in zip(times, times[1:])) < 1.0, notes
        assert session.error("slow", {"seconds": "x"})
    finally:
        session.close()


def test_a_user_error_is_one_line_of_tool_error(server):
    text = server.error("build", {"force": True})
    assert text == "Error executing tool build: force: name what to run again (kernel ids or task names)"
    text = server.error("write_candidate", {"kernel": "nope", "candidate": "c", "code": "x"})
    assert "no kernel 'nope' in magpie.toml" in text and "\n" not in text


@pytest.mark.skipif(not os.environ.get("MCP_INSPECTOR_CLI"), reason="the MCP inspector's CLI: .ci/run installs it")
def test_the_mcp_inspectors_strict_schema_check_passes(project):
    """The official inspector's portability check of every tool's schemas (exit 6 on an error)."""
    done = subprocess.run(
        ["node", os.environ["MCP_INSPECTOR_CLI"], "--cli", "--strict", "--method", "tools/list", "--"]
        + [sys.executable, "-m", "magpie", "mcp"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    assert TOOLS <= {tool["name"] for tool in json.loads(done.stdout)["tools"]}


def test_importing_magpie_and_its_cli_imports_no_mcp():
    code = "import sys, magpie, magpie.cli; sys.exit(any(m.split('.')[0] in ('mcp', 'mcp_types') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_session(port: int, token: str | None) -> Session:
    """The SDK's client over streamable HTTP, sending the bearer token where given."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    return Session(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client))


def start_http_server(root: Path, env: dict | None = None) -> tuple[subprocess.Popen, int, str]:
    """`python -m magpie.mcp --http` listening: its process, port and the line it printed first."""
    import socket

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "magpie.mcp", "--http", "--port", str(port)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the HTTP server did not listen within 60 s"
            time.sleep(0.1)
    told, _, _ = select.select([process.stderr], [], [], 10)  # printed before it listens
    return process, port, process.stderr.readline() if told else ""


@pytest.fixture(scope="module")
def http_server(project):
    """(port, token, the server's first stderr line) of an HTTP server that made its own token."""
    process, port, first_line = start_http_server(project)
    token = (project / f"workspaces/mcp/http-{port}.token").read_text().strip()
    yield port, token, first_line
    process.terminate()
    process.wait(10)


def test_the_server_over_streamable_http(http_server):
    port, token, _ = http_server
    session = http_session(port, token)
    try:
        assert TOOLS <= {tool.name for tool in session.list_tools().tools}
        status = session.ok("project_status")
        assert status["kernels"] == ["relu2", "sleepy"]
        assert "outside the project" in session.error("gap_analysis", {"trace_dir": "../"})
    finally:
        session.close()


def http_status(port: int, method: str = "POST", path: str = "/mcp", **headers: str) -> int:
    import http.client

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}) if method == "POST" else None
    sent = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json", **headers}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body, sent)
        return connection.getresponse().status
    finally:
        connection.close()


def test_every_http_request_needs_the_bearer_token(http_server, project):
    """Any local process can reach a loopback port: without the token made at start, nothing is answered."""
    port, token, first_line = http_server
    path = project / f"workspaces/mcp/http-{port}.token"
    assert len(token) >= 32 and os.stat(path).st_mode & 0o777 == 0o600
    assert f"Authorization: Bearer {token}" in first_line and str(path) in first_line  # told once, at start
    wrong = {"Authorization": f"Bearer {token}x"}
    for method, where in [
        ("POST", "/mcp"),
        ("GET", "/mcp"),
        ("DELETE", "/mcp"),
        ("GET", "/"),
        ("GET", "/.well-known/x"),
    ]:
        assert http_status(port, method, where) == 401, (method, where)
        assert http_status(port, method, where, **wrong) == 401, (method, where)
    assert http_status(port, Authorization=token) == 401  # the scheme is part of it
    assert http_status(port, Authorization=f"Bearer {token}") != 401
    with pytest.raises(Exception):  # noqa: B017 - the SDK's client, refused whatever it raises
        http_session(port, None)
    assert "MAGPIE_MCP_TOKEN" not in os.environ


def test_a_token_given_in_the_environment_is_the_one_required_and_a_weak_one_refused(project, tmp_path):
    given = "t" * 31
    done = subprocess.run(
        [sys.executable, "-m", "magpie", "mcp", "--http"],
        cwd=project,
        env={**os.environ, "MAGPIE_MCP_TOKEN": given},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "MAGPIE_MCP_TOKEN: a bearer token" in done.stderr
    given = "given-token-0123456789-abcdefghijkl"
    process, port, first_line = start_http_server(project, {**os.environ, "MAGPIE_MCP_TOKEN": given})
    path = project / f"workspaces/mcp/http-{port}.token"
    try:
        assert given not in first_line and "MAGPIE_MCP_TOKEN" in first_line  # the invoker has it: not printed
        assert path.read_text().strip() == given
        assert http_status(port, Authorization=f"Bearer {given}") != 401
        assert http_status(port) == 401
    finally:
        process.terminate()
        process.wait(10)
    assert not path.exists()  # a stopped server's token is no one's


def test_dns_rebinding_is_refused_over_http(http_server):
    """A page on another site that rebinds its name to 127.0.0.1 sends its own Host and Origin."""
    port, token, _ = http_server
    bearer = f"Bearer {token}"
    assert http_status(port, Host="evil.example:80", Authorization=bearer) == 421
    assert http_status(port, Host=f"127.0.0.1:{port}", Origin="http://evil.example", Authorization=bearer) == 403
    assert http_status(port, Host=f"127.0.0.1:{port}", Authorization=bearer) not in (403, 421)


def test_the_verb_refuses_bad_options_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "magpie", "mcp", "--root", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "--root" in done.stderr
    done = subprocess.run([sys.executable, "-m", "magpie", "mcp", "--port", "9"], capture_output=True, text=True)
    assert done.returncode == 2 and "give them with --http" in done.stderr
    assert os.path.isdir(tmp_path)
