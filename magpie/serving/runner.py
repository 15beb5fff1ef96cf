"""One benchmark run, start to report: server up (local) or reached (external), load, metrics, files.

`run_benchmark(config)` always writes a workspace, even when it fails: `benchmark_config.json`
(the config, first), `server.log` (local mode), `bench_serve_result.json` (vLLM's `--save-result`
keys, when the load ran) and `benchmark_report.json` (`report.BenchmarkReport`). Failures become
`success: false` with one line per error in `errors` (the first is the one the CLI prints) and,
where the server's log says why, its tail: a model path that does not exist, an option the
engine has no flag for, a taken port, a server that exits or stays unready before the timeout,
a failed ready check, a server that dies during the run (its requests fail; the run ends), the
benchmark's timeout, Ctrl-C or SIGTERM (the report is written, then KeyboardInterrupt goes on).
The server's process group is stopped on every one of these paths.

With `config.profiler` the run is diagnostic: the engine's profiler (`profiling`) records a window
over the measured requests (opened after the warm-ups) into `torch_trace/`, and after the server's stop the trace analysis fills the
report's `tracelens_analysis`, `gap_analysis`, `kernel_summary` and `top_bottlenecks`.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from magpie.serving import docker_mode as _docker
from magpie.serving import engines as _engines
from magpie.serving import gpus as _gpus
from magpie.serving import lifecycle as _lifecycle
from magpie.serving import profiling as _profiling
from magpie.serving import replacement as _replacement
from magpie.serving.report import (
    ENV_THAT_MATTERS,
    BenchmarkConfig,
    BenchmarkReport,
    Provenance,
    ServerInfo,
    hub_revision,
    local_model_path,
    measured_fields,
    model_hash,
    prompt_tokenizer,
)

REPORT = "benchmark_report.json"
CONFIG = "benchmark_config.json"
RESULT = "bench_serve_result.json"
SERVER_LOG = "server.log"


class _Failed(Exception):
    """A failure already put into words; `detail` lines follow the message in `errors`."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str, allow_nan=False) + "\n")  # strict JSON: no Infinity
    tmp.replace(path)


def _provenance(config: BenchmarkConfig, engine, spec_env: dict[str, str], allocation: dict) -> Provenance:
    import socket

    from magpie import __version__

    path = local_model_path(config.model)
    in_docker = config.run_mode == "docker"  # the container sees the engine's environment, not ours
    env = {k: v for k, v in {**({} if in_docker else os.environ), **spec_env}.items() if k in ENV_THAT_MATTERS}
    return Provenance(
        magpie_version=__version__,
        engine=engine.name,
        engine_version=None if in_docker else engine.version(),
        model=config.model,
        model_path=str(path) if path and path.exists() else None,
        model_hash=model_hash(path) if path and path.exists() else None,
        model_revision=hub_revision(config.model),
        environment=env,
        gpu_allocation=allocation,
        python=platform.python_version(),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        command_line=list(sys.argv),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"magpie: warning: {line}", file=sys.stderr, flush=True)


def run_benchmark(config: BenchmarkConfig, analyse: bool = True, project: str = "") -> BenchmarkReport:
    """Runs the benchmark `config` describes; the report is also written to the workspace. With `analyse`
    false a profiled run leaves its traces unanalysed (the build analyses them in a node of their own).
    `project`: the project whose build runs it, recorded on a server it keeps (`magpie clean` there stops it)."""
    from magpie.serving.local import LocalServer, ServerError, exit_words, install_sigterm, tail

    t0 = time.monotonic()
    work = Path(config.output_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    _write_json(work / CONFIG, config.model_dump(mode="json"))
    engine_name = config.framework
    engine = _engines.get(engine_name)
    external = config.base_url is not None or not engine.launches
    errors: list[str] = []
    outputs = {"config": str(work / CONFIG)}
    report_kw: dict = {}
    server: LocalServer | None = None
    server_info: ServerInfo | None = None
    interrupted = False
    provenance = None
    prepared = None

    def remaining() -> float:
        return config.timeout_s - (time.monotonic() - t0)

    try:
        with install_sigterm():
            try:
                try:  # before any server starts: the tokenizer, and lengths that fit the context
                    config = config.model_copy(update={"tokenizer": prompt_tokenizer(config)})
                except ValueError as exc:
                    raise _Failed(str(exc)) from None
                spec = _engines.ServerSpec(
                    model=config.model,
                    host=config.host,
                    port=config.port,
                    tp=config.tp,
                    precision=config.precision,
                    max_model_len=config.max_model_len,
                    extra_args=config.extra_server_args,
                    env=config.env,
                )
                env = engine.environment(spec) if not external else {}
                trace_dir = work / _profiling.TRACE_DIR
                if config.profiler:
                    if external or not _profiling.supported(engine_name):
                        raise _Failed(
                            f"--torch-profiler: no profiler mechanism for {engine_name}"
                            f"{' with --base-url' if external else ''}: it needs a server of ours "
                            f"(vllm, sglang or transformers)"
                        )
                    if config.run_mode == "docker" and engine_name in _profiling.LAUNCHER_ENGINES:
                        raise _Failed(
                            f"--torch-profiler: {engine_name} is profiled by magpie's launcher, which "
                            f"its docker image does not hold; profile it in local mode"
                        )
                    env.update(_profiling.environment(engine_name, trace_dir))
                    outputs["torch_trace"] = str(trace_dir)
                if external:
                    allocation = {"mode": "external", "devices": []}
                else:
                    kept = _kept_devices(config, engine, spec, env)
                    env.update(kept)
                    try:
                        updates, allocation = _gpus.allocate(
                            env, config.tp, min_free_fraction=config.gpu_min_free_fraction
                        )
                    except _gpus.GpuError as exc:
                        provenance = _provenance(config, engine, env, {"mode": "auto", "error": str(exc)})
                        raise _Failed(str(exc)) from None
                    env.update(updates)
                    if kept:
                        allocation["kept_server"] = True
                provenance = _provenance(config, engine, env, allocation)
                if config.run_mode == "docker" and not external:
                    try:
                        prepared = _docker.prepare(engine_name, config.docker_image, allocation)
                        provenance.image, provenance.image_id = prepared.image, prepared.image_id
                        _docker.give_back(work, prepared.owner, prepared)  # under sudo: the container's user writes it
                    except _docker.DockerError as exc:
                        raise _Failed(f"docker mode: {exc}") from None
                if external:
                    if config.base_url is None:
                        raise _Failed(f"the {engine.name} engine starts no server: give --base-url URL")
                    base_url = config.base_url.rstrip("/")
                    server_info = ServerInfo(mode="external", base_url=base_url)
                else:
                    path = local_model_path(config.model)
                    if path is not None and not path.exists():
                        raise _Failed(f"model path not found: {config.model}")
                    try:
                        command = engine.command(spec, in_image=prepared is not None)
                        if config.profiler:
                            command = _profiling.command(engine_name, command)
                    except _engines.UnsupportedOption as exc:
                        raise _Failed(str(exc)) from None
                    base_url = engine.base_url(spec)
                    if config.replacement_hook and not _replacement.checked(Path(config.replacement_hook)):
                        # its targets found before any server starts
                        try:
                            _replacement.check_targets(
                                Path(config.replacement_hook), engine.python(), env, max(min(remaining(), 300.0), 1.0)
                            )
                        except _replacement.ReplacementError as exc:
                            raise _Failed(str(exc)) from None
                    log = work / SERVER_LOG
                    outputs["server_log"] = str(log)
                    health_url = base_url + engine.health_path
                    try:
                        # what killed runs left behind goes first (a dead run's server may hold this run's port)
                        _warn(_lifecycle.sweep())
                        if prepared is not None:
                            _warn(_docker.sweep(prepared.client))
                            server = _docker.DockerServer(
                                prepared,
                                command,
                                env=env,
                                log_path=log,
                                host=config.host,
                                port=engine.port(spec),
                                health_url=health_url,
                                workspace=work,
                                model_path=path if path is not None and path.exists() else None,
                            )
                            # what the container was given (an NVIDIA GPU allocation is a device request, not a
                            # variable)
                            provenance.environment = {
                                k: v for k, v in server.settings["environment"].items() if k in ENV_THAT_MATTERS
                            }
                        else:
                            wanted = _lifecycle.record_for(provenance, command, env, config.host, engine.port(spec))
                            if config.server_lifecycle == "reuse":
                                server = _lifecycle.KeptServer(
                                    wanted, env=env, health_url=health_url, run_log=log, project=project
                                )
                            else:
                                server = _lifecycle.TrackedServer(
                                    wanted, env=env, health_url=health_url, log_path=log, cwd=work
                                )
                    except ServerError as exc:  # the folder of server records is unusable
                        raise _Failed(str(exc)) from None
                    server_info = ServerInfo(mode=config.run_mode, base_url=base_url, command=command, log=str(log))
                    try:
                        if prepared is not None:
                            _warn(
                                _lifecycle.make_room(
                                    config.host, engine.port(spec), "this run starts a container on that port"
                                )
                            )
                        server.start()
                        _warn(getattr(server, "warnings", []))
                        server_info.pid = server.pid
                        server_info.container = getattr(server, "container_id", None)
                        server_info.reused = isinstance(server, _lifecycle.KeptServer) and server.reused
                        provenance.server_reused = server_info.reused
                        ready_budget = min(config.ready_timeout_s or config.timeout_s, remaining())
                        server_info.ready_after_s = server.wait_ready(ready_budget)
                        if prepared is not None:
                            provenance.engine_version = server.engine_version(engine.package)
                    except ServerError as exc:
                        raise _Failed(str(exc), exc.log_tail) from None
                    if config.replacement_hook:
                        _installed_at_start(config, remaining)
                profile = None
                if config.profiler:
                    pid = server.pid if server is not None else None
                    profile = (
                        lambda: _profiling.start(engine_name, base_url, pid, trace_dir),
                        lambda: _profiling.stop(
                            engine_name, base_url, pid, trace_dir, wait_s=max(min(remaining(), 300.0), 10.0)
                        ),
                    )
                _load(
                    config,
                    engine,
                    base_url,
                    server,
                    remaining,
                    work,
                    report_kw,
                    outputs,
                    _monitored(allocation),
                    profile,
                )
                if config.replacement_hook:
                    try:
                        pids = _replacement.verify_installed(Path(config.replacement_hook), config.replacements)
                    except _replacement.ReplacementError as exc:
                        raise _Failed(str(exc)) from None
                    provenance.replacements = [{**r.model_dump(mode="json"), **pids} for r in config.replacements]
            except _Failed as exc:
                errors.append(str(exc))
                if exc.detail:
                    errors.append("server log tail:\n" + exc.detail)
            except KeyboardInterrupt:
                interrupted = True
                run = report_kw.get("run")
                errors.append(
                    "interrupted (Ctrl-C or SIGTERM)"
                    + (
                        f": the report is partial, the {run.completed + run.failed} requests finished before it"
                        if run is not None
                        else ""
                    )
                    + ("; the server was stopped" if server is not None else "")
                )
            finally:
                if server is not None:
                    run = report_kw.get("run")
                    if (run is not None and run.failed) or errors:
                        # requests failed: a server on its way out closes its sockets before it exits
                        server.wait_exit(timeout_s=2.0)
                    died = server.exit_code() is not None and server.ready_after is not None
                    # a kept server serves later runs only after a clean one; any failure stops it for good
                    kept = (
                        isinstance(server, _lifecycle.KeptServer)
                        and not died
                        and not errors
                        and run is not None
                        and not run.failed
                    )
                    code = server.keep() if kept else server.stop()
                    if server_info is not None:
                        server_info.exit_code = code
                        server_info.died_during_run = died
                        server_info.kept = kept
                    if died:
                        errors.insert(
                            0,
                            f"the server exited with code {code} during the run"
                            f"{exit_words(server.log_path)}; log: {server.log_path}",
                        )
                        errors.append("server log tail:\n" + tail(server.log_path))
                    if prepared is not None:
                        errors.extend(server.cleanup_errors())
    except KeyboardInterrupt:  # a second Ctrl-C while stopping: the report is still written
        interrupted = True
        if server is not None:
            server.stop(grace_s=0)
    run = report_kw.get("run")
    if run is not None and run.failed:
        errors.append(
            f"{run.failed} of {run.failed + run.completed} requests failed; first: {report_kw.pop('first_error', '')}"
        )
    report_kw.pop("first_error", None)
    if config.profiler and report_kw.get("traces"):
        no_model = _profiling.missing_model_ops(report_kw["traces"])
        if no_model:
            errors.append(no_model)
    if analyse and config.profiler and config.analysis_mode and report_kw.get("traces"):
        _analyse(report_kw, work, outputs, errors, config.analysis_mode)
    report_kw.pop("traces", None)
    success = not errors and run is not None and run.completed > 0
    report = BenchmarkReport(
        success=success,
        framework=engine_name,
        model=config.model,
        workspace_dir=str(work),
        execution_time=time.monotonic() - t0,
        run_kind=config.run_kind,
        profiling_enabled=config.profiler,
        reward_eligible=success and config.run_kind == "measurement",
        errors=errors,
        server=server_info,
        provenance=provenance,
        config=config,
        outputs={**outputs, "report": str(work / REPORT)},
        **report_kw,
    )
    _write_json(work / REPORT, report.model_dump(mode="json"))
    if prepared is not None and os.geteuid() == 0:
        _docker.give_back(work, prepared.owner)  # under sudo, magpie's own files are root's until here
    if interrupted:
        raise KeyboardInterrupt
    return report


def _installed_at_start(config: BenchmarkConfig, remaining, wait_s: float = 60.0) -> None:
    """After the server is ready: a process of it recorded each replacement installed (the model's process may
    record it a little after the health route answers), none failed; else the run's one line."""
    assert config.replacement_hook is not None
    folder = Path(config.replacement_hook)
    deadline = time.monotonic() + max(min(wait_s, remaining()), 0.0)
    while True:
        found = _replacement.records(folder)
        if found["failed"]:
            first = found["failed"][0]
            raise _Failed(
                f"the replacement of {first['target']!r} failed to install in the server's process "
                f"{first['pid']}: {first['error']}"
            )
        targets = {x["target"] for x in found["installed"]}
        missing = [r for r in config.replacements if r.target not in targets]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise _Failed(
                f"{missing[0].kernel}/{missing[0].implementation} in place of {missing[0].target!r} was not "
                f"installed in any process of the ready server within {wait_s:g} s (its hook, "
                f"{folder}/sitecustomize.py, did not run there)"
            )
        time.sleep(0.2)


def _kept_devices(config: BenchmarkConfig, engine, spec, env: dict[str, str]) -> dict[str, str]:
    """A run that may reuse a kept server (a sweep's later points, --keep-server) and pins no GPUs of its own takes
    the GPUs of the server kept on its port: its own process makes them look busy to the idle-GPU pick. Where it
    has fewer than TP of them, nothing: that server will not serve this run."""
    from magpie.serving.local import ServerError

    if config.server_lifecycle != "reuse" or config.run_mode != "local":
        return {}
    if any(name in env or name in os.environ for name in _gpus.PIN_VARIABLES):
        return {}
    try:
        kept = _lifecycle.kept_devices(config.host, engine.port(spec))
    except ServerError:
        return {}  # the folder of records is unusable: the start says so in its own line
    pinned = next((kept[name] for name in _gpus.PIN_VARIABLES if name in kept), None)
    if pinned is None or len(_gpus.parse_devices(pinned)) != config.tp:
        return {}
    return kept


def _analyse(report_kw: dict, work: Path, outputs: dict, errors: list[str], mode: str) -> None:
    """The trace analysis (`mode`) of the run's torch_trace/ into the workspace and the report's fields."""
    from magpie.traces.ingest import TraceError

    try:
        report_kw.update(_profiling.analyse(work / _profiling.TRACE_DIR, work, mode))
    except TraceError as exc:
        report_kw["tracelens_analysis"] = {"outputs": [], "errors": [str(exc)]}
        errors.append(f"trace analysis: {exc}")
        return
    outputs["tracelens"] = str(work / "tracelens")
    outputs["gap_analysis"] = report_kw["gap_analysis"]["outputs"]["gap_analysis"]


def _monitored(allocation: dict) -> list[int] | None:
    """The NVML indices to monitor: the allocation's where they are indices, else every device."""
    devices = allocation.get("devices") or []
    return devices if devices and all(isinstance(d, int) for d in devices) else None


def _load(
    config: BenchmarkConfig,
    engine,
    base_url: str,
    server,
    remaining,
    work: Path,
    report_kw: dict,
    outputs: dict,
    monitor_devices: list[int] | None = None,
    profile=None,
) -> None:
    from magpie.serving import load as _load_mod
    from magpie.serving.completed import CompletedRequests
    from magpie.serving.models import DatasetConfig, LoadConfig

    if remaining() <= 0:
        raise _Failed(f"the benchmark's timeout of {config.timeout_s:g} s passed before the load started")
    load_config = LoadConfig(
        base_url=base_url,
        model=config.model,
        endpoint=config.endpoint,
        num_prompts=config.num_prompts,
        dataset=DatasetConfig(
            input_len=config.input_len,
            output_len=config.output_len,
            range_ratio=config.range_ratio,
            prefix_len=config.prefix_len,
        ),
        tokenizer_id=config.tokenizer,
        request_rate=config.request_rate,
        burstiness=config.burstiness,
        max_concurrency=config.concurrency,
        num_warmups=config.num_warmups,
        seed=config.seed,
        goodput=config.goodput,
        # an engine with no way to fix the output length is sent OpenAI's standard fields alone
        force_len=engine.force_len or "ignore_eos",
        ignore_eos=None if engine.force_len else False,
        timeout_s=max(remaining(), 1.0) + 5.0,
        label=engine.name,
    )  # the watcher's deadline comes first
    samples = _load_mod.load_samples(load_config)
    completed = CompletedRequests()

    def before_measured():
        completed.start()
        if profile is not None:
            profile[0]()

    async def watched():
        completed.install(asyncio.get_running_loop())
        task = asyncio.ensure_future(_load_mod.run(load_config, samples, before_measured=before_measured))
        deadline = time.monotonic() + remaining()
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if task.done():
                break
            if time.monotonic() >= deadline:
                task.cancel()
                raise _Failed(f"the benchmark's timeout of {config.timeout_s:g} s passed during the load")
            if server is not None and not server.alive():
                # the server is gone: what is in flight fails as its connections close; give it a moment
                done, _ = await asyncio.wait({task}, timeout=5.0)
                if not done:
                    task.cancel()
                    raise _Failed("requests still in flight 5 s after the server exited were abandoned")
        return task.result()

    sampler, why = _gpus.open_sampler(monitor_devices)
    monitor = _gpus.GpuMonitor(sampler, config.gpu_monitor_interval_s).start() if sampler is not None else None
    try:
        try:
            record = asyncio.run(watched())
        except _profiling.ProfilerError as exc:  # from the start, after the warm-ups
            raise _Failed(f"the profiler did not start: {exc}") from None
        except KeyboardInterrupt:
            finished = completed.outputs()
            if finished:  # the report of what was done before it
                _record(
                    config,
                    load_config,
                    _load_mod.RunRecord(finished, completed.elapsed(), []),
                    work,
                    report_kw,
                    outputs,
                )
                report_kw["partial"] = True
            raise
        if profile is not None:
            try:
                report_kw["traces"] = profile[1]()
            except _profiling.ProfilerError as exc:
                raise _Failed(f"the profiler did not stop cleanly: {exc}") from None
    except RuntimeError as exc:  # the ready check's request failed
        raise _Failed(str(exc)) from None
    finally:
        if monitor is not None:
            report_kw["gpu_monitor"] = monitor.stop()
        else:
            report_kw["gpu_monitor_reason"] = why
    _record(config, load_config, record, work, report_kw, outputs)


def _record(config: BenchmarkConfig, load_config, record, work: Path, report_kw: dict, outputs: dict) -> None:
    """A run's records into the report's figures and vLLM's result file."""
    from magpie.serving import load as _load_mod
    from magpie.serving import metrics as _metrics

    metrics, flat = _metrics.compute(
        record.outputs, record.duration, goodput=config.goodput or None, percentiles=config.metric_percentiles
    )
    result = _load_mod.vllm_result(load_config, record, metrics, flat)
    _write_json(work / RESULT, result)
    outputs["bench_serve_result"] = str(work / RESULT)
    report_kw.update(measured_fields(record.outputs, metrics, result))
    report_kw["first_error"] = next((o.error for o in record.outputs if not o.success), "")
