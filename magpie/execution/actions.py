"""Built-in actions. Each takes a Job and a scratch folder and returns the result dict;
files left in the folder become part of the artifact."""

from __future__ import annotations

import json
import os
import py_compile
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import overload

from magpie import sandbox
from magpie.graph.expand import snapshot_path
from magpie.harness.keys import code_reads, evaluator_key
from magpie.harness.kinds import command_kind
from magpie.harness.kinds import failure as failed
from magpie.paths import subprocess_env
from magpie.supervision import device_lock
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.process import run_tree
from magpie.supervision.session import Worker, WorkerFailure, signal_verdict
from magpie.supervision.step_limit import step_limit_s, timeout_line


def compile_python(job, out_dir: Path) -> dict:
    impl = job.spec.params["impl"]
    root = Path(job.spec.params["root"])
    errors = []
    for rel in [impl["source"], *impl["source_files"]]:
        if not rel.endswith(".py"):
            continue
        try:
            py_compile.compile(str(root / rel), cfile=str(out_dir / "bytecode.pyc"), doraise=True)
        except py_compile.PyCompileError as err:
            errors.append(f"{rel}: {err.exc_type_name}: {str(err.exc_value).splitlines()[0]}")
    (out_dir / "bytecode.pyc").unlink(missing_ok=True)
    return {
        "compiling_state": "FAILED" if errors else "SUCCESS",
        "errors": errors,
        "failures": [failed("compile", "compile", e) for e in errors],
    }


def _template_context(job, out_dir: Path) -> dict:
    spec = job.spec
    impl = spec.params.get("impl") or {}
    return {
        "impl": SimpleNamespace(
            id=impl.get("id", ""),
            source=impl.get("source", ""),
            source_files=" ".join(impl.get("source_files", [])),
            type=impl.get("type", ""),
        ),
        "kernel": SimpleNamespace(id=spec.kernel or ""),
        "arch": spec.params.get("settings", {}).get("compile", {}).get("arch", ""),
        "out": str(out_dir),
        "root": spec.params["root"],
    }


# What to install for a compiler the built-in rules call.
TOOLCHAINS = {"hipcc": "ROCm", "nvcc": "the CUDA toolkit"}


def command(job, out_dir: Path) -> dict:
    """A rule whose action is a shell command template, e.g. a compiler invocation."""
    spec = job.spec
    settings = spec.params.get("settings", {}).get("compile", {})
    try:
        line = spec.action.format(**_template_context(job, out_dir))
    except (KeyError, AttributeError, IndexError) as err:
        return _command_result(spec, False, [f"rule {spec.rule!r}: bad placeholder {err} in action {spec.action!r}"])
    program = shlex.split(line)[0] if line.strip() else ""
    if program and not shutil.which(program) and not (Path(spec.params["root"]) / program).exists():
        return _command_result(
            spec,
            False,
            [
                f"{program} not found: install {TOOLCHAINS.get(program, 'it')} or override the action of rule "
                f"{spec.rule!r} for {spec.params.get('impl', {}).get('type', 'these')} kernels in magpie.toml "
                f'([[rule]] name = "{spec.rule}")'
            ],
        )
    cwd = Path(spec.params["root"]) / (settings.get("working_dir") or ".")
    scratch = scratch_folders.make("cmd-")
    # A rule's command (a candidate's compile command among them) writes its artifact's folder
    # and its own temporary folder, nothing else.
    impl = spec.params.get("impl")
    read = code_reads(Path(spec.params["root"]), impl, cwd) if impl else [spec.params["root"], str(cwd)]
    policy = (
        None
        if sandbox.trusted()
        else sandbox.Policy(write=[str(out_dir), str(scratch)], read=read, hide=workspace_of(job))
    )
    env = subprocess_env({**os.environ, **(settings.get("env") or {}), "TMPDIR": str(scratch)})
    started = time.monotonic()
    try:
        proc = run_tree(sandbox.command(["/bin/sh", "-c", line], policy), cwd=cwd, env=env, timeout=3600)
    except subprocess.TimeoutExpired:
        return _command_result(spec, False, ["timeout after 3600 s"], line)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (out_dir / "command.log").write_bytes(proc.stdout + proc.stderr)
    ok = proc.returncode == 0
    errors = (
        []
        if ok
        else [
            f"{signal_verdict(proc.returncode)}: "
            + " | ".join(proc.stderr.decode(errors="replace").strip().splitlines()[-3:])
        ]
    )
    result = _command_result(spec, ok, errors, line)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _command_result(spec, ok: bool, errors: list, line: str = "") -> dict:
    state = "SUCCESS" if ok else "FAILED"
    result = {"state": state, "command": line, "errors": errors}
    if spec.rule == "compile":
        result["compiling_state"] = state
        result["failures"] = [failed(command_kind(e, "compile"), "compile", e) for e in errors]
    return result


@overload
def with_library(job, impl: dict) -> dict: ...
@overload
def with_library(job, impl: None) -> None: ...
def with_library(job, impl: dict | None) -> dict | None:
    """An implementation compiled to a shared library carries its path to the evaluator."""
    if impl is None:
        return None
    folder = job.dep_dirs.get(f"compile:{job.spec.kernel}/{impl['id']}")
    library = Path(folder) / f"{impl['id']}.so" if folder else None
    return {**impl, "library": str(library)} if library and library.is_file() else impl


def snapshots_of(job) -> dict[str, str]:
    """Each input of the job's task -> the file holding the bytes its key was computed from."""
    folder = job.spec.params.get("snapshots")
    if not folder:
        return {}
    return {
        name: str(snapshot_path(Path(folder), digest))
        for name, digest in (job.spec.parts or {}).get("inputs", {}).items()
        if digest != "missing"
    }


def workspace_of(job) -> list[str]:
    """The artifact store's workspace (where the job's dependencies were stored), for the
    sandbox to hide: it holds this build's verdicts and its input secret."""
    folder = next(iter(job.dep_dirs.values()), None)
    return [str(Path(folder).parents[2])] if folder else []


def _evaluate(
    mode: str, job, out_dir: Path, baseline, timing_method: dict | None = None, baseline_own_timing: dict | None = None
) -> dict:
    spec = job.spec
    settings = spec.params["settings"]
    request = {
        "mode": mode,
        "root": spec.params["root"],
        "kernel": spec.kernel,
        "impl": with_library(job, spec.params["impl"]),
        "baseline": with_library(job, baseline),
        "settings": settings,
        "input_secret": job.input_secret,
        "hide": workspace_of(job),
        "snapshots": snapshots_of(job),
        "timing_method": timing_method,
        "baseline_own_timing": baseline_own_timing,
    }
    limit = step_limit_s(mode, settings)
    kind = "evaluator"
    work = scratch_folders.make(f"{mode}-")
    waits = work / device_lock.WAITS_FILE  # the evaluator's waits for the device: not counted
    try:
        request["work_dir"] = str(work)
        (work / "request.json").write_text(json.dumps(request))
        log_path = work / "evaluator.log"
        env = subprocess_env()
        asked = time.monotonic()
        # An evaluator runs no candidate code, so one that finished a job may take the next.
        evaluator = Worker(
            label="evaluator",
            cwd=os.getcwd(),
            env=env,
            memory_mb=0,
            log_path=log_path,
            key=evaluator_key(env),
            module="magpie.harness.evaluate",
        )
        started = None
        try:
            if evaluator.adopted:
                evaluator.request({"op": "relog", "log": str(log_path)}, 30)
            started = time.monotonic()
            answer = evaluator.request(
                {"op": "evaluate", "request": str(work / "request.json")},
                limit,
                not_counted=lambda: device_lock.waited_s(waits),
            )
            failure = None if answer["ok"] else f"evaluator error: {answer['error']}"
        except WorkerFailure as err:
            if started is not None and evaluator.timed_out:
                waited = device_lock.waited_s(waits)
                kind, failure = "timeout", timeout_line(mode, limit, waited)
            else:
                failure = f"evaluator {err}"
        finally:
            answered = time.monotonic()
            evaluator.release()
            parked = time.monotonic()
        for log in work.glob("worker-*.log"):
            shutil.copy(log, out_dir / log.name)
        if failure is None:
            assert started is not None  # an answer came: the request was sent
            result = answer["result"]
            # a build's first evaluators wait here for the zygote's imports
            result["evaluator_start_s"] = round(started - asked, 3)
            result["evaluator_park_s"] = round(parked - answered, 3)
            result["step_limit"] = {
                "limit_s": limit,
                "ran_s": round(answered - started, 3),
                "device_wait_s": round(device_lock.waited_s(waits), 3),
            }
            return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
    state_key = "correctness_state" if mode == "correctness" else "performance_state"
    return {
        state_key: "FAILED",
        "verdict": failure,
        "errors": [failure],
        "numerics": "unverified",
        "performance_result": None,
        "failures": [failed(kind, mode, failure)],
        **(
            {"step_limit": {"limit_s": limit, "ran_s": round(answered - started, 3), "device_wait_s": round(waited, 3)}}
            if kind == "timeout" and started is not None
            else {}
        ),
    }  # (a timeout: always started)


def correctness(job, out_dir: Path) -> dict:
    spec = job.spec
    compiled = job.dep_results.get(f"compile:{spec.kernel}/{spec.impl}")
    if compiled is not None and compiled.get("compiling_state") != "SUCCESS":
        reason = "; ".join(compiled.get("errors", [])) or "compile failed"
        return {
            "correctness_state": "SKIPPED",
            "numerics": "unverified",
            "verdict": f"not compiled: {reason}",
            "checks": [],
            "errors": [reason],
            "failures": [failed("not_compiled", "correctness", reason)],
        }
    return _evaluate("correctness", job, out_dir, baseline=None)


def timing(job, out_dir: Path) -> dict:
    spec = job.spec
    own = job.dep_results[f"correctness:{spec.kernel}/{spec.impl}"]
    if own.get("correctness_state") != "SUCCESS":
        reason = f"not timed: correctness {own.get('correctness_state')}: {own.get('verdict')}"
        return {
            "performance_state": "SKIPPED",
            "performance_result": None,
            "errors": [reason],
            "failures": [failed("not_correct", "timing", reason)],
        }
    baseline = spec.params["baseline"]
    warnings = []
    if baseline is not None and not spec.params["impl"]["is_baseline"]:
        base_ok = job.dep_results.get(f"correctness:{spec.kernel}/{baseline['id']}", {})
        if base_ok.get("correctness_state") != "SUCCESS":
            warnings.append(f"baseline {baseline['id']} is not correct ({base_ok.get('verdict')}): timed alone")
            baseline = None
    set_method = own = None
    if baseline is not None:  # the baseline's timing chose the method for its kernel's set
        its_timing = job.dep_results.get(f"timing:{spec.kernel}/{baseline['id']}", {})
        set_method = its_timing.get("timing_method")
        # what it read alone (what it reads beside this candidate is checked against it), and
        # whether that ran in this build (its worker is then around)
        own = {k: (its_timing.get("performance_result") or {}).get(k) for k in OWN_TIMING_KEYS}
        own["mode"] = (set_method or {}).get("mode")
        own["this_build"] = its_timing.get("input_secret") == job.input_secret
        # each further timed shape's the same way, with the method it chose for that shape
        own["shapes"] = {
            entry["shape"]: {
                **{k: (entry.get("performance_result") or {}).get(k) for k in OWN_TIMING_KEYS},
                "mode": (entry.get("timing_method") or {}).get("mode"),
                "timing_method": entry.get("timing_method"),
            }
            for entry in its_timing.get("shapes") or []
        }
    result = _evaluate("timing", job, out_dir, baseline=baseline, timing_method=set_method, baseline_own_timing=own)
    result.setdefault("warnings", []).extend(warnings)
    if result.get("performance_state") == "INCONCLUSIVE":
        # this build's comparison and report show it; the store keeps it as not final, and the
        # next build measures it again
        result["provisional"] = PROVISIONAL_INCONCLUSIVE
    return result


PROVISIONAL_INCONCLUSIVE = "inconclusive (machine busy)"
# What a candidate's timing takes from its baseline's own (per timed shape): the checks against it and what is
# not measured again beside the candidate (`TimingSession.known_of_baseline`)
OWN_TIMING_KEYS = (
    "shape",
    "median_us",
    "harness_us_per_call",
    "calibration_us",
    "sizing_us_per_call",
    "kernel_us",
    "kernels",
)


def comparison(job, out_dir: Path) -> dict:
    """Correctness gate first; then speedups against the explicit baseline."""
    from magpie.report.models import CompareReport, checked

    return checked(CompareReport, compare_results(job.spec.kernel, job.dep_results, job.spec.params.get("baseline")))


def compare_results(kernel: str, results: dict[str, dict], baseline: dict | None) -> dict:
    """A kernel's comparison from its implementations' results (task name -> result): the
    comparison's artifact, and what `magpie build --check` judges where a build covered some of
    a kernel's tasks but not its comparison."""
    impl_names = sorted(
        {name.split("/", 1)[1] for name in results if name.split(":", 1)[0] in ("compile", "correctness", "timing")}
    )
    rows = []
    for impl_id in impl_names:
        comp = results.get(f"compile:{kernel}/{impl_id}", {})
        corr = results.get(f"correctness:{kernel}/{impl_id}", {})
        tim = results.get(f"timing:{kernel}/{impl_id}", {})
        prof = results.get(f"profile:{kernel}/{impl_id}")
        rows.append(
            {
                "implementation": impl_id,
                "compiling_state": comp.get("compiling_state", "SKIPPED"),
                "correctness_state": corr.get("correctness_state", "SKIPPED"),
                "numerics": corr.get("numerics", "unverified"),
                "verdict": corr.get("verdict", ""),
                "performance_state": tim.get("performance_state", "SKIPPED"),
                "performance_result": tim.get("performance_result"),
                "baseline_result": tim.get("baseline_result"),
                "samples_us": tim.get("samples_us"),
                "speedup": None,
                "profile": prof,
                # a command-only kernel's kernels as ncu measured them: labelled profiler time, never ranked
                "profiler_time": (prof or {}).get("profiler_time"),
                "errors": [*comp.get("errors", []), *corr.get("errors", []), *tim.get("errors", [])],
                # the same, machine-readable (kind, stage, case): the cause first, then what it kept from running
                "failures": [*comp.get("failures", []), *corr.get("failures", []), *tim.get("failures", [])],
                "numerics_margin": corr.get("numerics_margin"),
                # the shapes drawn besides the declared ones, and why any were skipped (harness/held_out.py)
                "held_out": corr.get("held_out"),
                "warnings": [*corr.get("warnings", []), *tim.get("warnings", []), *profile_warnings(prof)],
                "flags": tim.get("flags", []),
                "timing_method": tim.get("timing_method"),
                "_paired_speedup": tim.get("speedup"),
                # each timed shape's timing and speedup, and their geometric mean (`harness/timed_shapes.py`)
                "shapes": tim.get("shapes"),
                "shapes_summary": tim.get("shapes_summary"),
                "time_s": time_spent(comp, corr, tim),
                "spec_error": corr.get("spec_error") or tim.get("spec_error"),
            }
        )
    report = rank(kernel, rows, baseline)
    # one error for the kernel per spec that failed, however many implementations it kept from being judged
    report["spec_errors"] = list({(e["spec"], e["detail"]): e for e in (r["spec_error"] for r in rows) if e}.values())
    report["errors"] = [f"spec error in {e['spec']}: {e['detail']}" for e in report["spec_errors"]]
    # what was timed: the shapes and dtype of the timings (`timing.shapes`; by default the first shape of the
    # first spec testcase), in the order they were timed
    timed = [entry["shape"] for r in rows for entry in r["shapes"] or [] if entry.get("performance_result")]
    timed += [r["performance_result"]["shape"] for r in rows if (r["performance_result"] or {}).get("shape")]
    report["timed_shapes"] = list(dict.fromkeys(timed))
    report["time_s"] = {key: round(sum(row["time_s"][key] or 0.0 for row in rows), 3) for key in TIME_KEYS}
    return report


def profile_warnings(profile: dict | None) -> list[str]:
    """A profile that failed or timed out is a warning on its row: the row keeps its verdict,
    timing and place in the ranking, without counters or a roofline."""
    if not profile or profile.get("state") != "FAILED":
        return []
    return [f"profile failed, no counters or roofline: {'; '.join(profile.get('errors') or ['no reason given'])}"]


TIME_KEYS = ("compile", "worker_starts", "first_calls", "correctness", "timing", "device_held")


def time_spent(compiled: dict, checked: dict, timed: dict) -> dict:
    """Where an implementation's evaluation time went, in seconds: its compile job; the
    start-up of the new workers its jobs loaded (fork, sandbox, CUDA context, module: on the
    H200 nine CUDA contexts made at once took 2 s each); the first calls of its correctness
    workers (JIT compile or cache load, autotuning, lazy loading: what a parked worker has
    done already); its correctness and timing jobs (waits included); and how long its timing
    job held the device alone (warm-up, measurement, kernel list)."""
    first_calls = [steps.get("first_call", 0.0) for steps in checked.get("worker_steps_s") or [] if steps]
    starts = [
        load.get("start", 0.0) + load.get("context", 0.0) + load.get("module", 0.0)
        for job in (checked, timed)
        for load in job.get("worker_loads_s") or []
    ]
    return {
        "compile": compiled.get("task_seconds"),
        "worker_starts": round(sum(starts), 4) if starts else None,
        "first_calls": round(sum(first_calls), 4) if first_calls else None,
        "correctness": checked.get("task_seconds"),
        "timing": timed.get("task_seconds"),
        "device_held": timed.get("device_held_s"),
    }


def rank(kernel: str, rows: list[dict], baseline: dict | None) -> dict:
    baseline_id = baseline["id"] if baseline else None
    excluded, ranked = [], []
    for row in rows:
        row["is_baseline"] = row["implementation"] == baseline_id
        paired = row.pop("_paired_speedup", None)
        if row.get("spec_error"):
            excluded.append(
                {
                    "implementation": row["implementation"],
                    "reason": f"not judged: spec error in {row['spec_error']['spec']}",
                }
            )
            continue
        if row["correctness_state"] != "SUCCESS":
            excluded.append(
                {
                    "implementation": row["implementation"],
                    "reason": f"correctness {row['correctness_state']}: {row['verdict']}",
                }
            )
            continue
        if row["performance_state"] != "SUCCESS":
            excluded.append(
                {
                    "implementation": row["implementation"],
                    "reason": f"performance {row['performance_state']}: {'; '.join(row['errors'])}",
                }
            )
            continue
        if row["is_baseline"]:
            row["speedup"] = {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "verdict": "baseline"}
        elif paired:
            row["speedup"] = paired
        ranked.append(row)
    ranked.sort(key=lambda r: (-(r["speedup"] or {}).get("value", 0.0), r["performance_result"]["median_us"]))
    best = next((r["implementation"] for r in ranked if (r["speedup"] or {}).get("verdict") == "faster"), None)
    methods = {r["implementation"]: (r.get("timing_method") or {}).get("mode") for r in rows if r.get("timing_method")}
    return {
        "kernel": kernel,
        "baseline": baseline_id,
        # one method for the whole set (the baseline's timing chose it); where rows differ (a
        # candidate timed while its baseline was not), each row says its own
        "timing_method": next((r["timing_method"] for r in rows if r["is_baseline"] and r.get("timing_method")), None)
        if len(set(methods.values())) <= 1
        else {"mixed": methods},
        "ranking": [r["implementation"] for r in ranked],
        "best": best,
        "excluded": excluded,
        "results": rows,
        "errors": [],
    }
