"""The project's tools: project_status, build, clean, verify, get_report, write_candidate."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from magpie.errors import UserError
from magpie.mcp.confine import identifier
from magpie.mcp.job_tools import start_job
from magpie.mcp.models import (
    BadArtifact,
    CleanResult,
    ImplementationVerdict,
    JobView,
    KernelReport,
    PlannedTask,
    ProjectStatus,
    ReportResult,
    Speedup,
    VerifyResult,
    WrittenCandidate,
)
from magpie.mcp.server import Services, annotated, tool

Wait = Annotated[bool, Field(description="run to the end before answering (progress notifications meanwhile)")]
# a candidate's source, at most: the server writes what an agent sends
MAX_SOURCE_BYTES = 1024 * 1024


def load_project(services: Services):
    from magpie.project import Project

    return Project.load(services.manifest)


def status_of(services: Services) -> ProjectStatus:
    from magpie.execution.build import Build, BuildOptions

    build = Build(BuildOptions(manifest=services.manifest))
    plan = build.dry_run()
    assert build.project is not None
    running = [job_id for job_id in services.jobs.ids() if services.jobs.status(job_id)["state"] == "running"]
    return ProjectStatus(
        root=str(services.root),
        kernels=[kernel.id for kernel in build.project.manifest.kernel],
        stale=[PlannedTask(task=task, why=why) for task, why in plan.would_run],
        up_to_date=plan.up_to_date,
        running_jobs=running,
    )


def refuse_while_building(services: Services, what: str) -> None:
    """The store is not emptied under a build that is writing it."""
    for job_id in services.jobs.ids():
        state = services.jobs.status(job_id)
        if state["kind"] == "build" and state["state"] == "running":
            raise UserError(f"{what}: build job {job_id} is running; wait for it or job_cancel it first")


def clean_store(services: Services, kernels: list[str], everything: bool) -> CleanResult:
    """What `magpie clean` does, through the store's API."""
    refuse_while_building(services, "clean")
    from magpie.graph import snapshot
    from magpie.graph.expand import known
    from magpie.report.publish import unpublish

    project = load_project(services)
    store = project.store
    names = [] if everything else project.select([identifier(k, "kernels") for k in kernels])
    stopped: list[str] = []
    if everything or any(project.tasks[name].scope == "benchmark" for name in names):
        from magpie.serving.lifecycle import stop_all
        from magpie.serving.local import ServerError

        try:
            stopped = stop_all(project=str(project.root))
        except ServerError as err:
            stopped = [f"warning: {err}"]
    if everything:
        removed = sum(1 for _ in store.objects.glob("*/*")) if store.objects.is_dir() else 0
        for folder in (store.objects, store.index, store.snapshots, store.workspace / "reports"):
            shutil.rmtree(folder, ignore_errors=True)
        store.file_digests_path.unlink(missing_ok=True)
        snapshot.path_for(project.manifest_path, project.manifest.project.workspace).unlink(missing_ok=True)
        return CleanResult(removed=removed, stopped_servers=stopped)
    if kernels:
        names += [n for n, spec in project.tasks.items() if spec.scope == "project"]
    removed = 0
    for name in names:
        recorded = store.recorded(name) or {}
        for key in {project.tasks[name].key, recorded.get("key")}:
            if isinstance(key, str) and known(key):
                removed += store.remove(key)
        store.forget(name)
    unpublish(project, project.with_dependents(names))
    return CleanResult(removed=removed, stopped_servers=stopped)


def verify_store(services: Services, fix: bool) -> VerifyResult:
    """What `magpie verify --json` does: every artifact against its digests and signature."""
    if fix:
        refuse_while_building(services, "verify fix")
    from urllib.parse import unquote

    from magpie.store import DIGEST

    project = load_project(services)
    store = project.store
    owners = {spec.key: name for name, spec in project.tasks.items()}
    if store.index.is_dir():
        for path in store.index.glob("*.json"):
            indexed = unquote(path.name[: -len(".json")])
            record = store.recorded(indexed)
            if record and isinstance(record.get("key"), str):
                owners.setdefault(record["key"], indexed)
    keys = sorted(
        folder.name
        for folder in (store.objects.glob("*/*") if store.objects.is_dir() else [])
        if folder.is_dir() and not folder.name.startswith(".tmp-")
    )
    bad = []
    for key in keys:
        task: str | None = owners.get(key)
        if task is None:
            try:
                task = json.loads((store.path(key) / DIGEST).read_text()).get("task")
            except (OSError, ValueError, AttributeError):
                task = None
        problem = store.check(key, task, trust_stamps=False) if task else store.problem(key)
        if problem is not None:
            current = task in project.tasks and project.tasks[task].key == key
            bad.append(BadArtifact(task=task, key=key, problem=problem, current=current))
            if fix:
                store.remove(key)
    return VerifyResult(checked=len(keys), bad=bad, removed=bool(fix and bad))


def kernel_report(path: Path, root: Path) -> KernelReport:
    from magpie.harness.clocks import clock_text

    report = json.loads(path.read_text())
    rows = []
    for row in report.get("results", []):
        speedup = row.get("speedup")
        performance = row.get("performance_result") or {}
        rows.append(
            ImplementationVerdict(
                implementation=row["implementation"],
                is_baseline=row.get("is_baseline", False),
                verdict=row.get("verdict", ""),
                compiling_state=row.get("compiling_state", ""),
                correctness_state=row.get("correctness_state", ""),
                performance_state=row.get("performance_state", ""),
                failure_kinds=sorted({f["kind"] for f in row.get("failures") or [] if "kind" in f}),
                errors=row.get("errors") or [],
                median_us=performance.get("median_us"),
                speedup=Speedup(**{k: speedup[k] for k in Speedup.model_fields}) if speedup else None,
                clock_state=clock_text(performance.get("clocks")) if performance else None,
                clocks=performance.get("clocks"),
            )
        )
    return KernelReport(
        kernel=report["kernel"],
        baseline=report.get("baseline"),
        best=report.get("best"),
        ranking=report.get("ranking", []),
        timed_shapes=report.get("timed_shapes", []),
        timing_method=report.get("timing_method"),
        implementations=rows,
        compare_report=os.path.relpath(path, root),
    )


def read_report(services: Services, kernel: str | None) -> ReportResult:
    reports = services.workspace / "reports"
    if kernel is not None:
        path = reports / identifier(kernel, "kernel") / "compare_report.json"
        if not path.is_file():
            raise UserError(f"kernel: no published report for {kernel!r}; build it first (build, then get_report)")
        paths = [path]
    else:
        paths = sorted(reports.glob("*/compare_report.json"))
    html = reports / "report.html"
    return ReportResult(
        kernels=[kernel_report(path, services.root) for path in paths],
        report_html=os.path.relpath(html, services.root) if html.is_file() else None,
    )


def write_candidate_file(
    services: Services, kernel: str, candidate: str, code: str, source: str | None
) -> WrittenCandidate:
    """Write the candidate's source and declare it in magpie.toml (or point its declaration
    at the new file), the manifest validated before it replaces the old one."""
    import tomlkit

    from magpie.manifest.load import load_manifest

    identifier(kernel, "kernel")
    identifier(candidate, "candidate")
    data = code.encode()
    if len(data) > MAX_SOURCE_BYTES:
        raise UserError(f"code: {len(data)} bytes; a candidate's source is at most {MAX_SOURCE_BYTES}")
    manifest, root = load_manifest(services.manifest)
    declared = next((k for k in manifest.kernel if k.id == kernel), None)
    if declared is None:
        raise UserError(f"kernel: no kernel {kernel!r} in magpie.toml (project_status lists them)")
    if declared.baseline is not None and declared.baseline.id == candidate:
        raise UserError(f"candidate: {candidate!r} is the baseline of {kernel}; a candidate may not replace it")
    previous = next((c for c in declared.candidates if c.id == candidate), None)
    suffix = ".py" if declared.type in ("pytorch", "triton") else {"cuda": ".cu", "hip": ".hip"}[declared.type]
    text = source or f"candidates/{kernel}/{candidate}{suffix}"
    target = services.confinement.path(text, "source", must_exist=False)
    own = previous is not None and os.path.realpath(root / previous.source) == str(target)
    if target.exists() and not own:
        raise UserError(
            f"source: {text!r} exists and is not {candidate}'s source; write a candidate to a new file "
            "(the baseline, specs and other files of the project are not a candidate's to overwrite)"
        )
    if any(part.startswith(".") for part in target.relative_to(services.root).parts):
        raise UserError(f"source: {text!r} is hidden (.git, .venv, ...); a candidate goes in a visible folder")
    if target.is_relative_to(os.path.realpath(services.workspace)) or target == services.manifest:
        raise UserError(f"source: {text!r} is magpie's own (the manifest or the workspace); choose another path")
    relative = os.path.relpath(target, services.root)
    document = tomlkit.parse(services.manifest.read_text())
    table = next(t for t in document["kernel"] if t.get("id") == kernel)  # type: ignore[union-attr]
    if previous is not None:
        entry = next(c for c in table["candidates"] if c.get("id") == candidate)
        entry["source"] = relative
    else:
        if "candidates" not in table:
            table["candidates"] = tomlkit.aot()
        entry = tomlkit.table()
        entry["id"] = candidate
        entry["source"] = relative
        table["candidates"].append(entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    existed = target.read_bytes() if own and target.exists() else None
    target.write_bytes(data)
    staged = services.manifest.with_name(".magpie.toml.mcp.tmp")
    staged.write_text(tomlkit.dumps(document))
    try:
        load_manifest(staged)  # the new manifest validated (ids, files) before it is the project's
    except UserError as err:
        staged.unlink()
        if existed is None:
            target.unlink()
        else:
            target.write_bytes(existed)
        raise UserError(str(err).replace(str(staged), "magpie.toml")) from None
    os.replace(staged, services.manifest)
    return WrittenCandidate(
        kernel=kernel, candidate=candidate, source=relative, replaced=previous is not None, bytes=len(data)
    )


def register(app: MCPServer, services: Services) -> None:
    @tool(app, annotated(read_only=True, idempotent=True))
    def project_status() -> ProjectStatus:
        """The project's kernels, what a build would run and why (per artifact: never built, which input
        changed, ...), how many artifacts are up to date, and the jobs running."""
        return status_of(services)

    @tool(app, annotated(read_only=False, idempotent=True))
    async def build(
        ctx: Context,
        targets: Annotated[list[str], Field(description="kernel ids or task names; none: everything")] = [],  # noqa: B006
        jobs: Annotated[int, Field(ge=1, le=64, description="independent tasks run at once")] = 1,
        force: Annotated[bool, Field(description="run the targets again even where up to date")] = False,
        verify: Annotated[bool, Field(description="hash every artifact first, rebuild any modified")] = False,
        wait: Wait = False,
    ) -> Annotated[CallToolResult, JobView]:
        """Build the project's stale artifacts (compile, correctness, timing, comparison, report) as a job;
        every implementation runs sandboxed. Returns the job at once, or its result with wait=true."""
        if force and not targets:
            raise UserError("force: name what to run again (kernel ids or task names)")
        return await start_job(
            ctx, services, "build", {"targets": targets, "jobs": jobs, "force": force, "verify": verify}, wait
        )

    @tool(app, annotated(read_only=False, destructive=True, idempotent=True))
    def clean(
        kernels: Annotated[list[str], Field(description="kernel ids or task names; none: the whole project")] = [],  # noqa: B006
        everything: Annotated[bool, Field(description="empty the whole store, its index and reports")] = False,
    ) -> CleanResult:
        """Remove artifacts (of the given kernels, or all of the project's): the next build makes them again."""
        return clean_store(services, kernels, everything)

    @tool(app, annotated(read_only=False, destructive=True, idempotent=True))
    def verify(
        fix: Annotated[
            bool, Field(description="remove the bad artifacts, so that the next build rebuilds them")
        ] = False,
    ) -> VerifyResult:
        """Check every artifact in the store against its recorded digests and signature."""
        return verify_store(services, fix)

    @tool(app, annotated(read_only=True, idempotent=True))
    def get_report(
        kernel: Annotated[str | None, Field(description="one kernel's id; none: every kernel built")] = None,
    ) -> ReportResult:
        """The published verdicts per kernel: per implementation its verdict, states, failure kinds, median
        time and speedup with its interval, the GPU's clock state while it was timed; the timed shapes and
        the timing method."""
        return read_report(services, kernel)

    @tool(app, annotated(read_only=False, destructive=True, idempotent=True))
    def write_candidate(
        kernel: Annotated[str, Field(description="the kernel's id in magpie.toml")],
        candidate: Annotated[str, Field(description="the candidate's id (new, or one to replace)")],
        code: Annotated[str, Field(description="the candidate's whole source")],
        source: Annotated[
            str | None,
            Field(description="where to write it, relative to the project root (default candidates/KERNEL/ID.py)"),
        ] = None,
    ) -> WrittenCandidate:
        """Add or replace a candidate's source inside the project and declare it in magpie.toml; build judges
        it like any candidate (sandboxed, against the reference, timed against the baseline)."""
        return write_candidate_file(services, kernel, candidate, code, source)
