"""The device lock: checks share a device, a measurement holds it alone, and a waiting
measurement is not starved by checks that keep arriving; no wait is endless, and the lock
files are the user's own."""

import fcntl
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, write

from magpie import environment
from magpie.supervision import device_lock


def _hold(device: str, kind: str, seconds: float, log, ready) -> None:
    ready.set()
    with getattr(device_lock, kind)(device):
        log.put((kind, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((kind, "out", time.monotonic()))


def _run(steps: list[tuple[str, float, float]]) -> list[tuple[str, str]]:
    """Start holders one after another (kind, seconds held, pause before the next); the order
    in which they entered and left."""
    context = multiprocessing.get_context("fork")
    device = f"test-{uuid.uuid4().hex[:8]}"
    log = context.Queue()
    procs = []
    for index, (kind, held, pause) in enumerate(steps):
        ready = context.Event()
        proc = context.Process(target=_hold, args=(device, kind, held, log, ready), name=f"{kind}{index}")
        proc.start()
        ready.wait(10)
        procs.append(proc)
        time.sleep(pause)
    for proc in procs:
        proc.join(30)
    events = sorted((log.get(timeout=5) for _ in range(2 * len(steps))), key=lambda e: e[2])
    return [(kind, edge) for kind, edge, _ in events]


def test_sharers_overlap_and_a_measurement_waits_for_them():
    order = _run([("shared", 0.6, 0.2), ("shared", 0.6, 0.2), ("exclusive", 0.1, 0.0)])
    # both sharers were in before either left; the measurement came in only after both left
    assert order[:2] == [("shared", "in"), ("shared", "in")]
    assert order[2:] == [("shared", "out"), ("shared", "out"), ("exclusive", "in"), ("exclusive", "out")]


def test_a_waiting_measurement_goes_before_sharers_that_arrive_after_it():
    order = _run([("shared", 0.8, 0.2), ("exclusive", 0.3, 0.3), ("shared", 0.1, 0.0)])
    assert order == [
        ("shared", "in"),
        ("shared", "out"),
        ("exclusive", "in"),
        ("exclusive", "out"),
        ("shared", "in"),
        ("shared", "out"),
    ]


# -- no endless wait, and a private folder -------------------------------------------------
HOLD = """
import sys, time
from magpie.supervision import device_lock
with getattr(device_lock, sys.argv[1])(sys.argv[2]):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(kind: str, device: str, folder: Path, token: str, env: dict | None = None) -> subprocess.Popen:
    """A process that holds the device lock (the token in its command line) until killed."""
    script = folder / f"{token}.py"
    script.write_text(HOLD)
    proc = subprocess.Popen(
        [sys.executable, str(script), kind, device],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize(
    "held, wanted, role",
    [("exclusive", "shared", "turnstile"), ("exclusive", "exclusive", "turnstile"), ("shared", "exclusive", "lock")],
)
def test_a_wait_ends_in_one_line_naming_the_lock_file_and_its_holder(monkeypatch, tmp_path, held, wanted, role):
    device = f"test-{uuid.uuid4().hex[:8]}"
    holder = _holder(held, device, tmp_path, "holder")
    try:
        monkeypatch.setenv(environment.DEVICE_LOCK_TIMEOUT_S, "0.5")
        started = time.monotonic()
        with pytest.raises(device_lock.DeviceLockTimeout) as caught:
            with getattr(device_lock, wanted)(device):
                pass
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    line = str(caught.value)
    assert isinstance(caught.value, RuntimeError) and "\n" not in line
    path = device_lock.folder() / f"{device}.{role}"
    assert re.match(rf"device lock: gave up after \d+ s waiting for {re.escape(str(path))} \(", line), line
    assert f"held all that time by pid {holder.pid} ({sys.executable} {tmp_path / 'holder.py'} {held} {device})" in line
    assert line.endswith("; MAGPIE_DEVICE_LOCK_TIMEOUT_S sets the wait")


def _hold_shared(path: str, seconds: float, ready) -> None:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        ready.set()
        time.sleep(seconds)


def test_a_wait_behind_holders_that_keep_changing_does_not_time_out(monkeypatch):
    """The timeout is for a holder that stays: a queue that moves is waited for as long as it
    takes, also by a sharer behind the turnstile that the waiting measurement holds."""
    device = f"test-{uuid.uuid4().hex[:8]}"
    path = str(device_lock._path(device, "lock"))
    context = multiprocessing.get_context("fork")
    monkeypatch.setenv(environment.DEVICE_LOCK_TIMEOUT_S, "1.5")
    holders = []

    def hold_next():
        ready = context.Event()
        proc = context.Process(target=_hold_shared, args=(path, 1.6, ready))
        proc.start()
        ready.wait(10)
        holders.append(proc)

    def more():  # each new holder comes 0.8 s after the last, while it still holds
        for _ in range(2):
            time.sleep(0.8)
            hold_next()

    waited = {}

    def measure():
        started = time.monotonic()
        with device_lock.exclusive(device):
            waited["exclusive"] = time.monotonic() - started

    hold_next()
    feeder, measurer = threading.Thread(target=more), threading.Thread(target=measure)
    feeder.start()
    measurer.start()
    time.sleep(0.3)  # the measurement holds the turnstile now, waiting for the holders to go
    started = time.monotonic()
    with device_lock.shared(device):
        waited["shared"] = time.monotonic() - started
    for thread in (feeder, measurer):
        thread.join()
    for proc in holders:
        proc.join(10)
    # both well past the timeout: the holders changed all along
    assert waited["exclusive"] > 2.5 and waited["shared"] > 2.0, waited


def test_lock_files_live_in_a_private_folder_of_the_user(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with device_lock.exclusive("cuda:0"):
        pass
    folder = tmp_path / f"magpie-locks-{os.getuid()}"
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["cuda-0.lock", "cuda-0.turnstile"]
    folder.chmod(0o755)  # another user could put a file or a link there
    with pytest.raises(
        device_lock.DeviceLockError, match=f"device lock: {re.escape(str(folder))} is not a private folder of this user"
    ):
        with device_lock.shared("cuda:0"):
            pass
    folder.chmod(0o700)
    os.rename(folder, tmp_path / "elsewhere")
    folder.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(device_lock.DeviceLockError, match="is not a private folder"):
        with device_lock.shared("cuda:0"):
            pass


def test_a_lock_timeout_is_that_jobs_failure_in_the_locks_own_words(tmp_path):
    """An evaluator that cannot get the device in time fails its job with the lock's line, as
    it is; the build goes on."""
    project, temp = tmp_path / "project", tmp_path / "tmp"
    project.mkdir()
    temp.mkdir()
    write(project, COMMAND_PROJECT)
    env = {"TMPDIR": str(temp), environment.DEVICE_LOCK_TIMEOUT_S: "1"}
    holder = _holder("exclusive", "cpu", tmp_path, "stuck-holder", env)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "magpie", "build", "--json", "correctness:k2/c"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
        )
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(p.read_text()) for p in (project / "workspaces/store").glob("*/*/result.json")]
    verdict = next(r for r in results if r.get("task") == "correctness:k2/c")
    assert verdict["correctness_state"] == "FAILED"
    turnstile = temp / f"magpie-locks-{os.getuid()}" / "cpu.turnstile"
    expected = (
        rf"evaluator error: device lock: gave up after \d+ s waiting for {re.escape(str(turnstile))} "
        rf"\(to share the device\), held all that time by pid {holder.pid} \({re.escape(sys.executable)} "
        rf"{re.escape(str(tmp_path / 'stuck-holder.py'))} exclusive cpu\); "
        rf"MAGPIE_DEVICE_LOCK_TIMEOUT_S sets the wait"
    )
    assert re.fullmatch(expected, verdict["errors"][0]), verdict["errors"][0]
    assert verdict["verdict"] == verdict["errors"][0]
