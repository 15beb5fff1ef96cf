"""A build stopped from outside leaves none of its processes behind: with SIGTERM it stops
them all and says in one line which tasks it stopped (exit 143, nothing of them stored);
killed with SIGKILL, its process pool, forkserver, resource tracker and zygote notice and end."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import COMMAND_PROJECT, FIXTURES, build_json, magpie, relu2_project, write

from magpie.supervision import scratch as scratch_folders


def _hanging_project(root, token: str) -> None:
    """The command project, its testcases a command that hangs (the token in its command line)."""
    files = dict(COMMAND_PROJECT)
    files["magpie.toml"] = files["magpie.toml"].replace("python -c 'import sys; sys.exit(0)'", f"sleep 600 # {token}")
    write(root, files)


def _processes() -> dict[int, tuple[int, str, int, str]]:
    """pid -> (parent pid, state, start time, command line) of every process /proc shows."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), fields[0].decode(), int(fields[19]), command)
    return table


def _descendants(root: int) -> dict[tuple[int, int], str]:
    """(pid, start time) -> command line of every process under root."""
    table = _processes()
    found, stack = {}, [root]
    while stack:
        parent = stack.pop()
        for pid, (ppid, _, start, command) in table.items():
            if ppid == parent and (pid, start) not in found:
                found[(pid, start)] = command
                stack.append(pid)
    return found


def _alive(procs) -> list[tuple[int, int]]:
    table = _processes()
    return [
        (pid, start)
        for pid, start in procs
        if pid in table and table[pid][2] == start and table[pid][1] not in ("Z", "X")
    ]


def _gone_within(procs, seconds: float) -> list[tuple[int, int]]:
    deadline = time.monotonic() + seconds
    while (left := _alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _kill(procs) -> None:
    for pid, _ in _alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _start_hanging_build(root, jobs: int):
    """A real `magpie build -j N` whose correctness jobs all hang in their command; returns it
    once N of them run, with every process under it then."""
    token = f"hang-{uuid.uuid4().hex[:12]}"
    _hanging_project(root, token)
    stderr = open(root / "stderr.txt", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "magpie", "build", "-j", str(jobs), "--plain"],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    stderr.close()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        hanging = [c for c in _descendants(proc.pid).values() if c.startswith("/bin/sh -c sleep 600") and token in c]
        if len(hanging) >= jobs:
            break
        time.sleep(0.1)
    assert proc.poll() is None, (root / "stderr.txt").read_text()
    assert len(hanging) >= jobs, (root / "stderr.txt").read_text()
    return proc, _descendants(proc.pid)


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_stops_every_process_and_names_the_tasks_it_stopped(tmp_path, jobs):
    proc, tree = _start_hanging_build(tmp_path, jobs)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        left = _gone_within(tree, 5)
        assert not left, [tree[p] for p in left]
    finally:
        proc.kill()
        _kill(tree)
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    started = [m.group(1) for m in map(re.compile(r"run   (\S+)  \(").match, lines) if m]
    finished = {m.group(1) for m in map(re.compile(r"(?:done  |FAIL  )(\S+?):? ").match, lines) if m}
    running = [name for name in started if name not in finished]
    assert len(running) == jobs and all(name.startswith("correctness:") for name in running)
    stopped = re.fullmatch(r"magpie: stopped by SIGTERM while running (.+); nothing of them was stored", lines[-1])
    assert stopped and sorted(stopped.group(1).split(", ")) == sorted(running), lines[-1]
    assert sum("magpie:" in line for line in lines) == 1, lines
    # the store: the finished artifacts whole, the stopped ones absent, nothing half-written
    store = tmp_path / "workspaces/store"
    assert not list(store.glob("*/.tmp-*"))
    magpie("verify", cwd=tmp_path, check=0)
    plan = json.loads(magpie("build", "--dry-run", "--json", cwd=tmp_path, check=0).stdout)
    assert set(running) <= {item["task"] for item in plan["would_run"]}
    assert not [item for item in plan["would_run"] if item["task"] in finished], plan


def test_sigkill_leaves_no_pool_forkserver_resource_tracker_or_zygote(tmp_path):
    proc, tree = _start_hanging_build(tmp_path, 2)
    own = {
        p: c
        for p, c in tree.items()
        if "multiprocessing" in c or ("magpie.supervision.zygote" in c and _processes().get(p[0], (0,))[0] == proc.pid)
    }
    kinds = {
        kind: [p for p, c in own.items() if kind in c]
        for kind in ("multiprocessing.forkserver", "multiprocessing.resource_tracker", "magpie.supervision.zygote")
    }
    assert all(kinds.values()), own  # there were all of them to end
    assert len(kinds["multiprocessing.forkserver"]) >= 3  # the server and the pool's two processes
    jobs = {p: c for p, c in tree.items() if p not in own}
    folders = _scratch_folders_of({proc.pid, *(pid for pid, _ in tree)})
    assert {f.name.split("-")[0] for f in folders} >= {"zygote", "job"}, folders
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        left = _gone_within(own, 10)
        assert not left, [own[p] for p in left]
        survivors = _gone_within(jobs, 5)  # the zygote ends its children, the commands die with them
        assert not survivors, [jobs[p] for p in survivors]
        scratch_folders.sweep()  # what the next build does first
        assert not [f for f in folders if f.exists()]
    finally:
        _kill(tree)


def test_a_sweep_leaves_a_folder_being_made_and_one_its_owner_removes_meanwhile(monkeypatch):
    """A build's sweep runs while other processes make their folders: one read between its
    owner file's creation and its write (empty, or half written) is being made, not abandoned;
    one removed by its owner while the sweep looks at it is no error."""
    being_made, half_written, abandoned = (scratch_folders.make(prefix) for prefix in ("made-", "half-", "old-"))
    try:
        (being_made / scratch_folders.OWNER).write_text("")
        (half_written / scratch_folders.OWNER).write_text(str(os.getpid()))
        (abandoned / scratch_folders.OWNER).write_text("")
        os.utime(abandoned, (0, 0))
        scratch_folders.sweep()
        assert being_made.is_dir() and half_written.is_dir() and not abandoned.exists()

        opened = scratch_folders.open_left

        def removed_by_its_owner_first(path):
            if path.parent == being_made:
                shutil.rmtree(being_made)
            return opened(path)

        monkeypatch.setattr(scratch_folders, "open_left", removed_by_its_owner_first)
        scratch_folders.sweep()
        assert half_written.is_dir()
    finally:
        for folder in (being_made, half_written, abandoned):
            shutil.rmtree(folder, ignore_errors=True)


def _scratch_folders_of(pids: set[int]) -> list:
    """The scratch folders (`magpie.supervision.scratch`) these processes own: the build's
    zygote's, its jobs' and its workers'."""
    owned = []
    for folder in scratch_folders.root().iterdir():
        try:
            pid = int((folder / scratch_folders.OWNER).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid in pids:
            owned.append(folder)
    return owned


def test_a_finished_build_holds_no_reader_of_its_output_waiting():
    """A caller that reads a build's output through a pipe (`subprocess.run`, `| jq`) waits
    for every process holding it: the job pool's server leaves without the interpreter's
    teardown (nothing registered before its exit runs), and the resource tracker, which
    outlives the build by a moment, holds the null device, not the build's output."""
    teardown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import atexit; atexit.register(print, 'torn down'); import magpie.execution.server_exit",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert teardown.returncode == 0 and "torn down" not in teardown.stdout
    streams = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from magpie.execution import pool; pool.prestart(2); "
            "from multiprocessing import resource_tracker as tracker; pid = tracker._resource_tracker._pid; "
            "print(os.readlink(f'/proc/{pid}/fd/1'), os.readlink(f'/proc/{pid}/fd/2'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert streams.stdout.split() == [os.devnull, os.devnull], streams.stderr


LEAVE_PROCESSES = """
import os, subprocess
subprocess.Popen(["sleep", "300", "{token}"], start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        os.execvp("sleep", ["sleep", "301", "{token}"])
    os._exit(0)
"""


def _left_with(token: str) -> list[str]:
    return [command for _, _, _, command in _processes().values() if token in command and "pytest" not in command]


def test_trusted_code_leaves_no_process_behind(tmp_path):
    """With --trust-code there is no sandbox whose PID namespace ends everything: a candidate
    that starts processes in a new session, or double-forks out of its process group, and a
    command testcase that does the same, leave nothing once the build is done (each ran below
    a keeper, `magpie.supervision.keeper`)."""
    _trusted_build_leaves_nothing(tmp_path, "cpu", commands=True)


@pytest.mark.gpu
@pytest.mark.parametrize("trust", [True, False], ids=["trusted", "sandboxed"])
def test_code_on_the_gpu_that_leaves_processes_leaves_none_and_holds_no_profile(tmp_path, trust):
    """The same on a GPU: the candidate's worker makes its CUDA context below its keeper, and
    ncu, which waits for every process it follows, follows the profiled process alone and ends
    with it instead of at the profile's timeout, in a sandbox as without one."""
    _trusted_build_leaves_nothing(tmp_path, "cuda", commands=False, trust=trust)


def _trusted_build_leaves_nothing(tmp_path, device: str, commands: bool, trust: bool = True) -> None:
    token = f"0.000{uuid.uuid4().int % 10**12:012d}"  # sleep adds it to its time: in its command line
    candidate = (FIXTURES / "adversarial" / "good.py").read_text() + LEAVE_PROCESSES.format(token=token)
    (tmp_path / "leaver.py").write_text(candidate)
    relu2_project(tmp_path, ["leaver"], shapes="[[8, 16]]", device=device)
    try:
        assert build_json(tmp_path, *(["--trust-code"] if trust else []))["failed"] == []
        rows = json.loads((tmp_path / "workspaces/reports/relu2/compare_report.json").read_text())["results"]
        assert {r["implementation"]: r["correctness_state"] for r in rows} == {"good": "SUCCESS", "leaver": "SUCCESS"}
        assert not _left_with(token)
        for profile in (r["profile"] for r in rows if r["profile"]):
            assert profile["state"] == "SUCCESS", profile
            assert sum(a["wall_s"] for a in profile["attempts"]) < profile["timeout_s"] / 2, profile["attempts"]
        if not commands:
            return
        commands = tmp_path / "commands"
        write(commands, COMMAND_PROJECT)
        manifest = commands / "magpie.toml"
        manifest.write_text(
            manifest.read_text().replace(
                "python -c 'import sys; sys.exit(0)'",
                f'sh -c \\"(setsid sleep 302 {token} &); sleep 303 {token} & exit 0\\"',
            )
        )
        assert build_json(commands, "--trust-code")["failed"] == []
        assert not _left_with(token)
    finally:
        for pid, (_, _, _, command) in _processes().items():
            if token in command and "pytest" not in command:
                os.kill(pid, signal.SIGKILL)


# A profiler as ncu is: what its target leaves is reparented to it, and it waits for all of it.
WAITING_PROFILER = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
if os.fork() == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
"""


def test_a_profile_of_trusted_code_that_left_a_process_ends_at_its_timeout_with_all_of_it():
    """A profiler that waits for every process of its target waits forever for one the code
    left; at the profile's timeout everything below the command is killed, not the keeper
    alone (which left the profiler and the process to run on, holding the output pipes)."""
    from magpie import sandbox
    from magpie.supervision.process import run_tree

    token = f"0.000{uuid.uuid4().int % 10**12:012d}"
    target = ["/bin/sh", "-c", f"(setsid sleep 302 {token} &); exit 0"]
    started = time.monotonic()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run_tree(sandbox.command([sys.executable, "-c", WAITING_PROFILER, *target], None), timeout=2)
        assert time.monotonic() - started < 10
        assert not _left_with(token)
    finally:
        for pid, (_, _, _, command) in _processes().items():
            if token in command and "pytest" not in command:
                os.kill(pid, signal.SIGKILL)


def test_a_finished_build_leaves_no_workers_folder_behind(tmp_path):
    """Workers parked when the build ends are ended with its zygote, and their scratch folders
    (their inputs and outputs, in memory under /dev/shm) go with them, not at the next build's
    sweep."""
    started = time.time()
    (tmp_path / "twin.py").write_text((FIXTURES / "adversarial" / "good.py").read_text())
    relu2_project(tmp_path, ["twin"], shapes="[[33, 65]]")
    build = subprocess.Popen(
        [sys.executable, "-m", "magpie", "build", "--json", "-j", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folders = set()  # the workers' folders, seen while the build runs (they may be gone as it returns)
    while build.poll() is None:
        for folder in scratch_folders.root().iterdir():
            try:
                if folder.name.startswith("w-") and folder.stat().st_mtime >= started:
                    folders.add(folder)
            except FileNotFoundError:  # removed as it was listed
                pass
        time.sleep(0.05)
    out, err = build.communicate()
    assert json.loads(out)["failed"] == [], err
    assert folders  # the build's workers had folders
    deadline = time.monotonic() + 10
    while (left := [f for f in folders if f.exists()]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left
