"""Every step that judges code under test has a hard wall-clock limit, derived from its settings
and kept by its job above the evaluator (`supervision.step_limit`); and nothing of a step
outlives it: after a timeout, a crash or its evaluator's death, the sandbox trees of its
workers (stopped or not) are killed and their folders removed.

Each build runs in a process of its own, watched while it runs: every process below it (the
zygote, evaluators, workers and their sandboxes) and every scratch folder they owned is
recorded, and once the build has ended none of them may be left."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, relu2_project

from magpie.supervision import device_lock
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.step_limit import step_limit_s

# timeout_s of these projects (each timed call of `sleeps_in_c_when_timed` blocks 6 s, within what the
# evaluator allows a batch)
TIMEOUT_S = 4
DEFAULTS = f"timeout_s = {TIMEOUT_S}\ntrials = 2"
TIMING = "warmup_ms = 5\nbudget_ms = 60\nrounds = 3"
# The timing step's limit for these settings (41.3 s): what a timeout must be reported within, 5 s more.
LIMIT_S = step_limit_s(
    "timing", {"correctness": {"timeout_s": TIMEOUT_S, "testcases": [{}]}, "timing": {"warmup_ms": 5, "budget_ms": 60}}
)


def _processes() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, state, start time) of every process /proc shows."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), fields[0].decode(), int(fields[19]))
    return table


def _below(root: int, table: dict) -> set[tuple[int, int]]:
    """(pid, start time) of every process under root."""
    found, todo = set(), [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, start) in table.items():
            if ppid == parent and (pid, start) not in found:
                found.add((pid, start))
                todo.append(pid)
    return found


def _alive(seen: set[tuple[int, int]]) -> list[tuple[int, int, str]]:
    table = _processes()
    return [
        (pid, start, table[pid][1])
        for pid, start in seen
        if pid in table and table[pid][2] == start and table[pid][1] not in ("Z", "X")
    ]


def _owned_folders(pids: set[int]) -> set[str]:
    """The scratch folders these processes own, and the folders their workers saw as /dev/shm."""
    owned = set()
    for folder in scratch_folders.root().iterdir():
        try:
            owner = int((folder / scratch_folders.OWNER).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if owner in pids:
            owned |= {str(folder), str(scratch_folders.lent_folder(folder))}
    return owned


def _evaluator_of(pid: int) -> tuple[str, Path] | None:
    """The implementation whose timing the process evaluates and its job's folder, if it is an
    evaluator in a timing job (its output goes to the job's folder, beside the job's request)."""
    try:
        log = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    folder = Path(log).parent
    if not (log.endswith("/evaluator.log") and folder.name.startswith("timing-")):
        return None
    try:
        return json.loads((folder / "request.json").read_text())["impl"]["id"], folder
    except (OSError, ValueError, KeyError):
        return None


def _watched_build(root, jobs: int, on_evaluator: dict | None = None) -> dict:
    """`magpie build -j jobs` in a process of its own, watched until it ends: its report, its
    tasks' results, how long it took, and what of its processes and folders was left 5 s after
    it ended. `on_evaluator`: implementation -> (seconds, signal): the evaluator of its timing
    gets the signal once it has run that long, its waits for the device lock (other builds'
    measurements on this shared machine) not counted, so that its workers are at work."""
    build = subprocess.Popen(
        [sys.executable, "-m", "magpie", "build", "-j", str(jobs), "--plain"],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, folders, first_seen, signalled = set(), set(), {}, {}
    started = time.monotonic()
    while build.poll() is None and time.monotonic() - started < 900:
        seen |= _below(build.pid, _processes())
        folders |= _owned_folders({pid for pid, _ in seen})
        for pid, _, _ in _alive(seen):
            impl, folder = _evaluator_of(pid) or (None, None)
            if impl in (on_evaluator or {}) and impl not in signalled:
                first_seen.setdefault(impl, time.monotonic())
                after_s, sig = on_evaluator[impl]
                if (
                    time.monotonic() - first_seen[impl] - device_lock.waited_s(folder / device_lock.WAITS_FILE)
                    >= after_s
                ):
                    os.kill(pid, sig)
                    signalled[impl] = pid
        time.sleep(0.1)
    output = build.communicate(timeout=60)[0] if build.poll() is not None else None
    elapsed = time.monotonic() - started
    build.kill()
    deadline = time.monotonic() + 5
    while (left := _alive(seen)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _, _ in left:  # not to outlive the test either
        os.kill(pid, signal.SIGKILL)
    results = {}
    for path in (root / "workspaces/store").glob("*/*/result.json"):
        result = json.loads(path.read_text())
        if "task" in result:
            results[result["task"]] = result
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    return {
        "output": output,
        "returncode": build.returncode,
        "elapsed": elapsed,
        "signalled": signalled,
        "left": left,
        "folders_left": sorted(f for f in folders if os.path.exists(f)),
        "results": results,
        "rows": {row["implementation"]: row for row in report["results"]},
    }


def _project(root, candidates: dict[str, str]) -> None:
    """relu2 with candidates named as keys, each a copy of the adversarial fixture named by its value."""
    for name, fixture in candidates.items():
        shutil.copy(FIXTURES / "adversarial" / f"{fixture}.py", root / f"{name}.py")
    relu2_project(root, list(candidates), shapes="[[8, 16]]", defaults=DEFAULTS, timing=TIMING)


# The watched builds, each made once for the module (`watched_builds`): most of their time is spent
# waiting out step limits. Scenario -> (-j, candidates as `_project` takes them, `on_evaluator` as
# `_watched_build` takes it).
SCENARIOS = {
    # stalls the evaluator cannot bound (each call in time, many calls), and stalls it can
    "at_eight_jobs": (
        8,
        {
            name: name
            for name in (
                "sleeps_in_c_when_timed",
                "spins_when_timed",
                "blocks_when_timed",
                "stops_when_timed",
                "stops_its_parent",
                "batches_repeated_inputs",
                "holds_no_stray_descriptor",
            )
        },
        {},
    ),
    # at -j 1: the stall the evaluator cannot bound, and an evaluator killed with SIGKILL mid-timing
    "at_one_job": (
        1,
        {"sleeps_in_c_when_timed": "sleeps_in_c_when_timed", "evaluator_killed": "sleeps_in_c_when_timed"},
        {"evaluator_killed": (6.0, signal.SIGKILL)},
    ),
    # at -j 1, an evaluator stopped from outside: it keeps no deadline of its own then
    "stopped_at_one_job": (
        1,
        {"evaluator_stopped": "sleeps_in_c_when_timed"},
        {"evaluator_stopped": (1.0, signal.SIGSTOP)},
    ),
}


@pytest.fixture(scope="module")
def watched_builds(tmp_path_factory):
    """scenario -> its watched build, made as a test first reads it. Not a parametrized module fixture:
    pytest orders tests by a parameter's position in each test's own list, and with the tests' different
    lists (`_in`) each scenario was built twice."""
    builds = {}

    def build(scenario: str) -> dict:
        if scenario not in builds:
            jobs, candidates, on_evaluator = SCENARIOS[scenario]
            root = tmp_path_factory.mktemp(scenario)
            _project(root, candidates)
            builds[scenario] = _watched_build(root, jobs, on_evaluator)
        return builds[scenario]

    return build


@pytest.fixture(params=list(SCENARIOS))
def watched(request, watched_builds):
    return watched_builds(request.param)


def _timed_out_in_time(build: dict, impl: str) -> dict:
    """The implementation's timing: a timeout, reported within its step's limit and 5 s, its
    waits for the device (other jobs' measurements) not counted."""
    row, timing = build["rows"][impl], build["results"][f"timing:relu2/{impl}"]
    assert row["correctness_state"] == "SUCCESS", row["verdict"]
    assert row["performance_state"] == "FAILED" and any(f["kind"] == "timeout" for f in row["failures"]), row
    step = timing["step_limit"]
    assert step["limit_s"] == LIMIT_S
    assert step["ran_s"] - step["device_wait_s"] <= LIMIT_S + 5, step
    return row


def _in(*scenarios: str):
    """The test reads the watched build of each of these scenarios."""
    return pytest.mark.parametrize("watched", scenarios, indirect=True)


@_in("at_eight_jobs")
@pytest.mark.parametrize(
    "impl", ["sleeps_in_c_when_timed", "spins_when_timed", "blocks_when_timed", "stops_when_timed", "stops_its_parent"]
)
def test_a_stalled_timing_is_a_timeout_within_its_limit_at_eight_jobs(watched, impl):
    _timed_out_in_time(watched, impl)


@_in("at_eight_jobs", "at_one_job")
def test_each_call_in_time_and_too_many_of_them_is_the_steps_timeout(watched):
    """Each call blocks in a C call for longer than timeout_s, within what the evaluator allows a
    batch: every wait of the evaluator's ends in time, and the step would run for many minutes;
    its job ends it at its limit."""
    row = _timed_out_in_time(watched, "sleeps_in_c_when_timed")
    assert f"timeout after {LIMIT_S:g} s: the timing step's limit" in row["errors"][0], row["errors"]


@_in("at_eight_jobs")
def test_a_candidate_batching_repeated_inputs_does_not_stall_the_build(watched):
    """It computes every input it has seen at each call once it sees an input's memory again:
    right, slower with each slot; judged (here, timed as slow) or timed out within the limit."""
    row = watched["rows"]["batches_repeated_inputs"]
    timing = watched["results"]["timing:relu2/batches_repeated_inputs"]
    assert row["correctness_state"] == "SUCCESS", row["verdict"]
    step = timing["step_limit"]
    assert step["ran_s"] - step["device_wait_s"] <= LIMIT_S + 5, step


@_in("stopped_at_one_job")
def test_a_stopped_evaluator_is_killed_at_its_steps_limit(watched):
    assert "evaluator_stopped" in watched["signalled"], watched["output"]
    row = _timed_out_in_time(watched, "evaluator_stopped")
    assert f"timeout after {LIMIT_S:g} s" in row["errors"][0]


@_in("at_one_job")
def test_an_evaluator_killed_mid_timing_is_its_steps_failure(watched):
    assert "evaluator_killed" in watched["signalled"], watched["output"]
    row = watched["rows"]["evaluator_killed"]
    assert row["performance_state"] == "FAILED" and "SIGKILL" in row["errors"][0], row["errors"]


def test_nothing_of_a_build_outlives_it(watched):
    """No process the build started (the zygote, evaluators, workers, their sandboxes' inits,
    stopped or not) is left once it has ended, nor any scratch folder they owned (the workers'
    inputs, outputs and batch regions, in /dev/shm)."""
    assert "magpie: ran" in (watched["output"] or ""), watched["output"]  # it ended, none of its tasks stalled it
    assert watched["elapsed"] < 600, watched["output"]
    assert not watched["left"], watched["left"]
    assert not watched["folders_left"], watched["folders_left"]


@_in("at_eight_jobs")
def test_a_worker_holds_no_descriptor_but_its_streams_and_pipes(watched):
    """The zygote's descriptors (its owner's pidfd, its socket, other children's pipes) are
    closed in a new child: the candidate, listing /proc/self/fd as it is imported, finds only
    its standard streams and its two pipes to the evaluator."""
    row = watched["rows"]["holds_no_stray_descriptor"]
    assert row["correctness_state"] == "SUCCESS", row["verdict"]


@pytest.mark.gpu
def test_a_timing_stall_on_the_gpu_finishes_within_its_limit(tmp_path):
    """The H200 case: each call in time, too many of them (and a candidate that spins for good),
    with the device held alone while measured: a timeout within the step's limit, nothing left."""
    candidates = {name: name for name in ("sleeps_in_c_when_timed", "spins_when_timed", "batches_repeated_inputs")}
    for name in candidates:
        shutil.copy(FIXTURES / "adversarial" / f"{name}.py", tmp_path / f"{name}.py")
    relu2_project(tmp_path, list(candidates), shapes="[[8, 16]]", defaults=DEFAULTS, timing=TIMING, device="cuda")
    build = _watched_build(tmp_path, 1)
    assert "magpie: ran" in (build["output"] or ""), build["output"]
    _timed_out_in_time(build, "sleeps_in_c_when_timed")
    _timed_out_in_time(build, "spins_when_timed")
    timing = build["results"]["timing:relu2/batches_repeated_inputs"]["step_limit"]
    assert timing["ran_s"] - timing["device_wait_s"] <= LIMIT_S + 5, timing
    assert not build["left"] and not build["folders_left"], (build["left"], build["folders_left"])
