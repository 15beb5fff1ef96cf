"""The zygote forks evaluators and workers with torch already imported; what a child sees
(folder, environment, descriptors, exit status) must be what a fresh process would see."""

import contextlib
import json
import os
import shutil
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from magpie import environment, sandbox
from magpie.paths import subprocess_env
from magpie.supervision import zygote, zygote_server
from magpie.supervision.process import all_stopped
from magpie.supervision.session import Worker

PROBE = textwrap.dedent("""
    import json, os, signal, sys, time

    def main(argv):
        if argv[0] == "shm":  # what CUDA IPC makes there for a process that lends (its pid in the names)
            for name in (f"cuda.shm.0.{os.getpid():x}.1", f"torch_{os.getpid()}_1_0"):
                open(os.path.join("/dev/shm", name), "wb").close()
            print(os.getpid(), flush=True)
            if argv[1] == "stay":
                time.sleep(60)
            return 0
        if argv[0] == "report":
            print(json.dumps({"torch_preloaded": "torch" in sys.modules, "cwd": os.getcwd(),
                              "var": os.environ.get("PROBE_VAR"), "own_session": os.getsid(0) == os.getpid(),
                              "ppid": os.getppid()}))
            return 0
        if argv[0] == "exit":
            return int(argv[1])
        if argv[0] == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if argv[0] == "pipe":
            os.write(int(argv[1]), b"through the passed descriptor")
            return 0

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture
def probe_env(tmp_path):
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return env


def run_probe(tmp_path: Path, env: dict, *args: str, **kwargs):
    log = tmp_path / f"probe-{'-'.join(args)}.log"
    proc = zygote.launch("zygote_probe", list(args), cwd=str(tmp_path), env=env, log_path=log, **kwargs)
    return proc, proc.wait(timeout=120), log


def test_children_are_forked_with_torch_imported_and_their_own_folder_environment_and_session(tmp_path, probe_env):
    workdir = tmp_path / "work"
    workdir.mkdir()
    with zygote.session():
        folder = Path(os.environ[environment.ZYGOTE_DIR])
        proc = zygote.launch(
            "zygote_probe",
            ["report"],
            cwd=str(workdir),
            env={**probe_env, "PROBE_VAR": "a"},
            log_path=tmp_path / "a.log",
        )
        assert proc.wait(timeout=120) == 0
        other = zygote.launch(
            "zygote_probe",
            ["report"],
            cwd=str(workdir),
            env={**probe_env, "PROBE_VAR": "b"},
            log_path=tmp_path / "b.log",
        )
        assert other.wait(timeout=120) == 0
        pids = [int(p.read_text()) for p in folder.glob("*.pid")]
    seen = [json.loads((tmp_path / f"{v}.log").read_text()) for v in "ab"]
    assert [s["var"] for s in seen] == ["a", "b"]
    assert all(s["torch_preloaded"] and s["own_session"] and s["cwd"] == str(workdir) for s in seen)
    # PROBE_VAR could be read by an import, so each value has a zygote of its own
    assert len(pids) == 2 and {s["ppid"] for s in seen} == set(pids)
    assert not folder.exists()
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in pids), "zygotes outlived their session"


def _running(pid: int) -> bool:
    """Alive and not a zombie (here the zygotes are children of the test process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_exit_codes_signals_and_passed_descriptors_come_through(tmp_path, probe_env):
    with zygote.session():
        proc, code, _ = run_probe(tmp_path, probe_env, "exit", "3")
        assert isinstance(proc, zygote.ForkedProcess) and code == 3
        _, code, _ = run_probe(tmp_path, probe_env, "segv")
        assert code == -signal.SIGSEGV
        read_end, write_end = os.pipe()
        _, code, _ = run_probe(tmp_path, probe_env, "pipe", str(write_end), pass_fds=(write_end,))
        os.close(write_end)
        assert code == 0 and os.read(read_end, 100) == b"through the passed descriptor"
        os.close(read_end)


def test_outside_a_build_a_fresh_process_does_the_same(tmp_path, probe_env):
    assert environment.ZYGOTE_DIR not in os.environ
    proc, code, log = run_probe(tmp_path, probe_env, "report")
    assert not isinstance(proc, zygote.ForkedProcess) and code == 0
    assert json.loads(log.read_text())["torch_preloaded"] is False


def test_a_child_that_ends_at_once_reports_its_status(tmp_path, probe_env):
    """The fork's pid and the exit status can reach the requester in one read."""
    with zygote.session():
        for _ in range(20):
            proc, code, _ = run_probe(tmp_path, probe_env, "exit", "7")
            assert code == 7 and proc.poll() == 7


IMPLEMENTATION = "def kernel(x):\n    return x * 2\n"


def _worker(tmp_path: Path, key: str, name: str, sandbox: dict | None = None) -> Worker:
    worker = Worker(
        label="impl",
        cwd=str(tmp_path),
        env=subprocess_env(),
        memory_mb=0,
        log_path=tmp_path / f"{name}.log",
        key=key,
        sandbox=sandbox,
    )
    message = (
        {"op": "relog", "log": str(worker.live_log)}
        if worker.adopted
        else {
            "op": "load",
            "id": "impl",
            "source": str(tmp_path / "impl.py"),
            "entry": "kernel",
            "device": "cpu",
            "seed": 0,
            "threads": 1,
        }
    )
    assert worker.request(message, 60)["ok"]
    return worker


BUSY_IMPLEMENTATION = """
import subprocess, threading

def _spin():
    while True:
        pass

threading.Thread(target=_spin, daemon=True).start()
subprocess.Popen(["sleep", "60"])

def kernel(x):
    return x * 2
"""


def test_stop_returns_once_every_thread_and_child_of_the_worker_has_stopped(tmp_path):
    (tmp_path / "impl.py").write_text(BUSY_IMPLEMENTATION)
    with zygote.session():
        worker = _worker(tmp_path, "busy", "busy")
        try:
            for _ in range(20):
                worker.stop()
                assert all_stopped(worker.proc.pid)
                worker.resume()
                time.sleep(0.01)
                assert not all_stopped(worker.proc.pid)  # the spinning thread runs again
        finally:
            worker.kill()


def test_a_released_worker_is_adopted_by_the_next_job_with_its_key_only(tmp_path):
    (tmp_path / "impl.py").write_text(IMPLEMENTATION)
    with zygote.session():
        first = _worker(tmp_path, "key-a", "first")
        pid = first.proc.pid
        first.release()
        other_key = _worker(tmp_path, "key-b", "other")
        assert not other_key.adopted and other_key.proc.pid != pid
        again = _worker(tmp_path, "key-a", "again")
        assert again.adopted and again.proc.pid == pid
        # the adopted worker still holds its implementation and answers on the new pipes
        answer = again.request({"op": "run_own_inputs", "seed": 0, "outputs_file": str(tmp_path / "o.pt")}, 60)
        assert answer["ok"] is False and "get_inputs" in answer["error"]
        again.release()  # it failed a request: it is ended, not parked
        assert again.proc.wait(timeout=30) is not None
        fresh = _worker(tmp_path, "key-a", "fresh")
        assert not fresh.adopted
        owing = _worker(tmp_path, "key-c", "owing")
        owing.send({"op": "reset"})  # its answer never read: parking it would hand that answer on
        owing.release()
        assert not _worker(tmp_path, "key-c", "after_owing").adopted
        fresh.release()
        other_key.close()
    deadline = time.monotonic() + 10
    while _running(fresh.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(fresh.proc.pid), "a parked worker outlived its build's zygote"


def test_a_prestarted_zygote_is_the_one_later_launches_use(tmp_path, probe_env):
    with zygote.session(prestart=True):
        folder = Path(os.environ[environment.ZYGOTE_DIR])
        deadline = time.monotonic() + 120
        while not list(folder.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(folder.glob("*.sock")), "no zygote started before any launch"
        started = [p.read_text() for p in folder.glob("*.pid")]
        # the environment of now (pytest's variables change between a fixture and the test), where
        # the probe module is found: magpie's processes never look in their working folder
        env = {**subprocess_env(), "PYTHONPATH": probe_env["PYTHONPATH"]}
        proc = zygote.launch("zygote_probe", ["exit", "0"], cwd=str(tmp_path), env=env, log_path=tmp_path / "p.log")
        assert isinstance(proc, zygote.ForkedProcess) and proc.wait(timeout=60) == 0
        assert [p.read_text() for p in folder.glob("*.pid")] == started


def test_with_keep_warm_the_zygote_and_its_parked_workers_serve_the_next_build_then_end(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(environment.KEEP_WARM_S, "3")
    (tmp_path / "impl.py").write_text(IMPLEMENTATION)
    with zygote.session():
        first = _worker(tmp_path, "key-w", "first")
        worker_pid = first.proc.pid
        first.release()
        folder = Path(os.environ[environment.ZYGOTE_DIR])
    zygote_pid = int(next(folder.glob("*.pid")).read_text())
    assert _running(zygote_pid) and _running(worker_pid)  # the build is over; they are not
    with zygote.session():
        again = _worker(tmp_path, "key-w", "again")
        assert again.adopted and again.proc.pid == worker_pid
        again.release()
    deadline = time.monotonic() + 30
    while (_running(zygote_pid) or _running(worker_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(zygote_pid) and not _running(worker_pid), "idle warm zygote did not end"


def test_a_kept_warm_worker_serves_a_later_build_only_while_its_sandbox_hides_the_store(tmp_path, monkeypatch):
    """Workers are keyed by their content, not their build, so a kept-warm one serves the next
    build too; but a store removed and made again between builds is no longer covered in its
    view: it is ended, and the job gets a new process."""
    store = tmp_path / "workspace"
    store.mkdir()
    (tmp_path / "impl.py").write_text(IMPLEMENTATION)
    # made before the zygote's folder moves under tmp_path: the policy hides the temporary folders
    policy = sandbox.Policy(write=[], read=[str(tmp_path)], hide=[str(store)]).to_json()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(environment.KEEP_WARM_S, "30")
    pids = []
    for build in ("first", "second", "after the store was made again"):
        if build == "after the store was made again":
            shutil.rmtree(store)
            store.mkdir()
        with zygote.session():
            worker = _worker(tmp_path, "worker-how/what", build.split()[0], sandbox=policy)
            pids.append((worker.adopted, worker.proc.pid))
            worker.release()
    assert pids[0][0] is False and pids[1] == (True, pids[0][1])
    assert pids[2][0] is False and pids[2][1] != pids[0][1]
    assert not _running(pids[0][1])


HIDES_A_THREAD = """
import threading


def _spin():
    while True:
        pass


threading.Thread(target=_spin, daemon=True).start()
threading.active_count = lambda: 1  # what its worker counts before it is parked


def kernel(x):
    return x * 2
"""


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: every thread's


def test_a_parked_worker_runs_nothing_not_even_a_thread_its_code_hid(tmp_path):
    """The worker's own count of its threads is code under test's to forge: a parked process
    is stopped, every thread of it, so nothing it left behind runs while other jobs measure
    (or, kept warm, in later builds); adopted, it runs again."""
    (tmp_path / "impl.py").write_text(HIDES_A_THREAD)
    with zygote.session():
        worker = _worker(tmp_path, "key-hides", "hides")
        pid = worker.proc.pid
        worker.release()
        assert all_stopped(pid)
        before = _cpu_ticks(pid)
        time.sleep(0.5)
        assert _cpu_ticks(pid) - before <= 2  # clock ticks: its spinning thread would take 50
        again = _worker(tmp_path, "key-hides", "again")
        assert again.adopted and again.proc.pid == pid
        assert not all_stopped(pid)
        again.close()


STATEFUL_MODEL = """
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x):
        self.calls += 1
        return x * 0 + self.calls


def get_inputs():
    return [torch.ones(2)]
"""


def test_a_parked_kernelbench_worker_hands_on_the_model_a_fresh_process_would_build(tmp_path):
    (tmp_path / "model.py").write_text(STATEFUL_MODEL)
    load = {
        "op": "load",
        "id": "model",
        "source": str(tmp_path / "model.py"),
        "device": "cpu",
        "seed": 1,
        "init_from_module": True,
        "threads": 1,
    }

    def first_output(worker: Worker) -> float:
        out = tmp_path / "out.pt"
        assert worker.request({"op": "run_own_inputs", "seed": 0, "outputs_file": str(out)}, 60)["ok"]
        return float(torch.load(out, weights_only=True)["outputs"][0][0])

    with zygote.session():
        worker = Worker(
            label="model",
            cwd=str(tmp_path),
            env=subprocess_env(),
            memory_mb=0,
            log_path=tmp_path / "a.log",
            key="model",
        )
        assert worker.request(load, 60)["ok"]
        assert [first_output(worker), first_output(worker)] == [1.0, 2.0]
        worker.release()
        again = Worker(
            label="model",
            cwd=str(tmp_path),
            env=subprocess_env(),
            memory_mb=0,
            log_path=tmp_path / "b.log",
            key="model",
        )
        assert again.adopted and first_output(again) == 1.0
        again.close()


def test_when_too_many_are_parked_a_second_copy_goes_before_a_unique_one():
    children = zygote_server.Children()
    children.parked = {
        10: ("candidate-a", [], 1.0),
        11: ("evaluator", [], 2.0),
        12: ("evaluator", [], 3.0),
        13: ("candidate-b", [], 4.0),
    }
    assert children.victim() == 11  # not candidate-a, parked longer but the only one of its kind
    children.parked = {10: ("candidate-a", [], 1.0), 13: ("candidate-b", [], 4.0)}
    assert children.victim() == 10


def test_parking_an_implementations_new_content_ends_its_earlier_contents_workers_not_the_evaluators():
    """Workers outlive builds where the zygote is kept warm; one of an implementation's earlier
    content is never adopted again (unless the edit is undone), and left parked such workers
    pushed the evaluators (duplicate keys, evicted first) out."""
    children = zygote_server.Children()
    children.parked = {
        10: ("worker-a/old", [], 1.0),
        11: ("evaluator-1", [], 2.0),
        12: ("evaluator-1", [], 3.0),
        13: ("worker-b/other", [], 4.0),
        14: ("worker-a/new", [], 5.0),
        15: ("worker-a/new", [], 6.0),
    }
    assert children.stale("worker-a/new") == [10]  # not its twin, not another implementation's
    assert children.stale("evaluator-1") == []  # an evaluator's parking ends nothing
    assert zygote.slot("worker-a/new") == "worker-a" and zygote.slot("evaluator-1") is None


def test_the_parked_cap_fits_the_device_memory():
    assert zygote_server.parked_cap([]) == zygote_server.MAX_PARKED  # no GPU
    assert zygote_server.parked_cap([141 << 30]) == zygote_server.MAX_PARKED  # an H200's eighth holds more
    assert zygote_server.parked_cap([141 << 30, 24 << 30]) == 6  # the 24 GiB card's eighth: six contexts


def test_what_cuda_ipc_made_in_shared_memory_for_a_child_goes_with_it(tmp_path, probe_env):
    """The driver leaves an evaluator's pool of interprocess events in /dev/shm when it ends
    (80 KiB each; 38 such files after one run of the GPU tests on the H200): the zygote
    removes a child's as it reaps it, and those of children still running when it stops."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")

    def files(pid: int) -> list[Path]:
        return [Path(f"/dev/shm/cuda.shm.0.{pid:x}.1"), Path(f"/dev/shm/torch_{pid}_1_0")]

    staying = None
    try:
        with zygote.session():
            _, code, log = run_probe(tmp_path, probe_env, "shm", "end")
            ended = int(log.read_text())
            assert code == 0 and not any(f.exists() for f in files(ended))
            staying_log = tmp_path / "stay.log"
            # held: a child whose requester's handle is gone is killed (`Children.heard_from`)
            _held = zygote.launch(
                "zygote_probe", ["shm", "stay"], cwd=str(tmp_path), env=probe_env, log_path=staying_log
            )
            deadline = time.monotonic() + 60
            while not (staying_log.exists() and staying_log.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.05)
            staying = int(staying_log.read_text())
            assert all(f.exists() for f in files(staying))
        deadline = time.monotonic() + 10
        while any(f.exists() for f in files(staying)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(f.exists() for f in files(staying))
    finally:
        if staying is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(staying, signal.SIGKILL)
            for f in files(staying):
                f.unlink(missing_ok=True)
