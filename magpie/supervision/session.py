"""Parent side of a served process (a worker, or an evaluator): start or adopt it, send
commands with deadlines, turn a crash, a hang or an exhausted memory limit into a verdict
instead of an exception, and park it for the next job."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec

from magpie.linux import namespaces
from magpie.linux.processes import kill_tree
from magpie.linux.procfs import descendants
from magpie.sandbox import memory
from magpie.sandbox.init import SANDBOX_MEMORY
from magpie.supervision import scratch as scratch_folders
from magpie.supervision import shared_memory, zygote
from magpie.supervision.answers import wrong_fields
from magpie.supervision.process import wait_stopped


class WorkerFailure(Exception):
    """The worker died or stopped answering; str() is the verdict."""


class NothingParked(Exception):
    """A worker asked for with fork=False found no parked process of its key."""


def signal_verdict(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGKILL":
            return "crashed (SIGKILL: killed, often out of memory)"
        return f"crashed ({name})"
    if returncode == SANDBOX_MEMORY:
        return f"{memory.EXCEEDED} (exited with code {returncode})"
    return f"exited with code {returncode}"


# What of a worker's output a job keeps: its end. A candidate may print gigabytes.
LOG_KEPT_BYTES = 256 << 10
# The longest answer a worker may send (its samples, its kernels): the candidate's code can
# write to the answer pipe too, and an answer without end would fill the evaluator's memory.
ANSWER_MAX_BYTES = 64 << 20


# How often a wait whose deadline moves (`Worker.receive`'s not_counted) looks at it again.
LOOK_S = 1.0


def _end(proc: zygote.ForkedProcess, fds: list[int]) -> None:
    """An adopted process ended unused."""
    for fd in fds:
        os.close(fd)
    kill_tree(proc.pid)
    proc.wait()


class Worker:
    """A process that serves JSON-line commands on two pipes: a worker (`magpie.harness.worker`,
    the default) or an evaluator (`magpie.harness.evaluate`). With a key, it may be one an
    earlier job of the build parked (same code, same files, same environment: `adopted` says
    so, and it needs no load), and `release` parks it again for the next job instead of ending
    it, unless it failed. With fork=False only a parked one will do (NothingParked if none is).

    With a sandbox policy (code under test), the process gets a scratch folder of its own,
    the only place it may write: its log lives there (the job's `log_path` receives its end
    when the job is done with it), as do the files the evaluator exchanges with it, and its
    TMPDIR. The folder goes when the process does (`scratch`: one made for it already).
    `held_fd`: a descriptor a new process gets as its third argument (a spare's share of the
    device lock, which it closes once its context is made).
    """

    def __init__(
        self,
        *,
        label: str,
        cwd: str,
        env: dict,
        memory_mb: int,
        log_path: Path,
        key: str | None = None,
        module: str = "magpie.harness.worker",
        fork: bool = True,
        sandbox: dict | None = None,
        scratch: Path | None = None,
        held_fd: int | None = None,
    ):
        self.label = label
        self.log_path = log_path
        self.key = key
        self.failed = False
        self.timed_out = False  # killed at the deadline of a `receive`
        self._pending = False  # a command sent whose answer has not been read
        self.stopped = False
        self.sandboxed = sandbox is not None
        self.under_test = module == "magpie.harness.worker"  # its process runs the code under test
        self._answers_checked = self.under_test
        found = zygote.adopt(key, env) if key else None
        if (
            found is not None
            and sandbox is not None
            and not namespaces.still_hidden(found[0].pid, [*sandbox["hide"], *sandbox["temporary"]])
        ):
            _end(*found[:2])  # it would see what its sandbox hid when it started: not adopted
            found = None
        if found is None and not fork:
            raise NothingParked(key)
        self.adopted = found is not None
        if found is not None:
            self.proc, (self._command_write, self._answer_read), kept_scratch = found
            self.scratch = Path(kept_scratch) if kept_scratch else None
        else:
            self.scratch = (scratch or scratch_folders.make("w-")) if self.sandboxed else None
        # a GPU sandbox's /dev/shm: a folder of its own that what this process lends is linked into
        self.lending = (
            shared_memory.Lending.for_worker(self.scratch)
            if sandbox is not None and self.scratch is not None and sandbox.get("gpu")
            else None
        )
        # a new, empty log: an adopted worker's lies in the folder it writes, where a link would
        # have this truncate whatever it names
        os.close(scratch_folders.create(self.live_log))
        if found is None:
            if sandbox is not None:
                env = {**env, "TMPDIR": str(self.scratch)}
                sandbox = {**sandbox, "write": [*sandbox["write"], str(self.scratch)]}
                if self.lending:
                    sandbox["shared_memory"] = str(self.lending.folder)
            command_read, self._command_write = os.pipe()
            self._answer_read, answer_write = os.pipe()
            held = () if held_fd is None else (held_fd,)
            self.proc = zygote.launch(
                module,
                [str(command_read), str(answer_write), *map(str, held)],
                cwd=cwd,
                env=env,
                log_path=self.live_log,
                memory_mb=memory_mb,
                pass_fds=(command_read, answer_write, *held),
                sandbox=sandbox,
                scratch=str(self.scratch) if self.scratch else None,
                under_test=self.under_test,
            )
            os.close(command_read)
            os.close(answer_write)
            if self.scratch:
                scratch_folders.own(self.scratch, self.proc.pid)
        self._buffer = bytearray()
        self._sent = time.monotonic()

    @property
    def live_log(self) -> Path:
        """Where the process writes: its scratch folder when it has one, else the job's log."""
        return self.scratch / "output.log" if self.scratch else self.log_path

    def request(self, message: Any, timeout_s: float, not_counted=None) -> dict:
        """Send one command; return its answer, or raise WorkerFailure with the verdict."""
        self.send(message)
        return self.receive(timeout_s, not_counted)

    def send(self, message: Any) -> None:
        """Send a command (a dict, or a `harness.wire` Struct: either is one line of JSON) without
        waiting, so that several workers can work at once."""
        if self.lending:
            self.lending.sync()
        self._sent = time.monotonic()
        self._pending = True
        try:
            os.write(self._command_write, msgspec.json.encode(message) + b"\n")
        except BrokenPipeError:
            self.failed = True
            raise WorkerFailure(self._death_verdict()) from None

    def receive(self, timeout_s: float, not_counted=None) -> dict:
        """The answer to the last command sent, within timeout_s of sending it. `not_counted`:
        a function, asked again at least every LOOK_S, of the seconds since then that do not
        count (the process's waits for the device lock, `device_lock.waited_s`)."""
        started = self._sent
        while b"\n" not in self._buffer:
            remaining = started + timeout_s + (not_counted() if not_counted else 0.0) - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                raise self._ended(f"timeout after {timeout_s:g} s")
            ready, _, _ = select.select(
                [self._answer_read], [], [], min(remaining, LOOK_S) if not_counted else remaining
            )
            if not ready:
                continue
            chunk = os.read(self._answer_read, 1 << 20)
            if not chunk:
                self.failed = True
                raise WorkerFailure(self._death_verdict())
            self._buffer += chunk
            if b"\n" not in chunk and len(self._buffer) > ANSWER_MAX_BYTES:
                raise self._ended(f"error: sent more than {ANSWER_MAX_BYTES >> 20} MiB without ending its answer")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise self._ended(f"error: sent an answer that is not a JSON object: {line[:80]!r}")
        wrong = wrong_fields(answer) if self._answers_checked else None
        if wrong:
            raise self._ended(f"error: sent an answer of the wrong form ({wrong[:160]})")
        answer["wall_s"] = time.monotonic() - started
        self.failed = self.failed or not answer.get("ok")
        self._pending = False
        return answer

    def answering(self) -> bool:
        """Whether an answer, or the end of the pipe, waits to be read."""
        return b"\n" in self._buffer or bool(select.select([self._answer_read], [], [], 0)[0])

    def overdue(self, verdict: str) -> WorkerFailure:
        """Kill a worker that missed a deadline the caller keeps: the failure to raise."""
        return self._ended(verdict)

    def _ended(self, verdict: str) -> WorkerFailure:
        """Kill a worker that broke the protocol or its deadline: the failure to raise."""
        self.failed = True
        self.kill()
        return WorkerFailure(verdict)

    def _death_verdict(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            return "stopped answering (closed its pipe)"
        verdict = signal_verdict(code)
        tail = self.log_tail()
        return f"{verdict}: {tail}" if tail and code >= 0 else verdict

    def log_tail(self, lines: int = 3) -> str:
        return scratch_folders.last_lines(self.live_log, lines)

    def keep_log(self) -> None:
        """The job's log gets the end of what the process wrote (the size of what was left out
        said first)."""
        if self.live_log == self.log_path:
            return
        data, size = scratch_folders.tail(self.live_log, LOG_KEPT_BYTES)
        head = f"[{size - len(data)} earlier bytes of output not kept]\n".encode() if size > len(data) else b""
        with contextlib.suppress(OSError):
            self.log_path.write_bytes(head + data)

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()

    def stop(self) -> bool:
        """SIGSTOP to its process group: nothing it would run on its own, a thread the
        implementation started, say, competes with what another process measures. Returns
        once every thread of the process and of its children has stopped: the kernel stops
        the other threads only when the one it woke for the signal runs, which on a busy
        machine can be milliseconds after kill() returned. False where some have not within
        `process.STOP_WAIT_S` (a process that left the group, or uninterruptible sleep)."""
        self._signal(signal.SIGSTOP)
        self.stopped = True
        return wait_stopped(self.proc.pid)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.stopped = False

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def release(self) -> None:
        """Park the worker for a later job with the same key (its caches emptied), or end it.
        Only a zygote's child that failed nothing, owes no answer and runs no thread besides
        its main one and no process besides its own is parked: the next job must find the
        protocol where a fresh process would have it, and nothing of it may run while other
        jobs measure."""
        if (
            self.key
            and isinstance(self.proc, zygote.ForkedProcess)
            and not self.failed
            and not self._pending
            and not self._buffer
            and self.proc.poll() is None
        ):
            try:
                answer = self.request({"op": "reset"}, 30)
                reset = answer["ok"] and answer.get("threads", 1) == 1 and not self._left_processes()
            except WorkerFailure:
                reset = False
            if reset:
                self.keep_log()  # before another job may adopt it and start its log anew
                if self._parked(self.key, stop=True):
                    return
        self.close()

    def park_spare(self, key: str) -> bool:
        """Park a spare (started, told to prepare, no code under test loaded) as it is, still
        preparing: none of the checks `release` makes, whose subject is what code under test
        left. False (and it is ended) where it cannot be parked."""
        if isinstance(self.proc, zygote.ForkedProcess) and self._parked(key, stop=False):
            return True
        self.close()
        return False

    def _parked(self, key: str, stop: bool) -> bool:
        """Whether the zygote took this process under key (this side then keeps nothing of it)."""
        if not self.proc.park(key, [self._command_write, self._answer_read], stop=stop):
            return False
        for fd in (self._command_write, self._answer_read):
            os.close(fd)
        return True

    def _left_processes(self) -> bool:
        """Whether a process the code under test started still runs, counted from here (what
        the worker answers, its code may forge): a sandboxed worker's tree is the sandbox's
        waiter, its init and the worker, a trusted one's its keeper and the worker, magpie's
        own process alone."""
        return len(descendants(self.proc.pid)) > (3 if self.sandboxed else 2 if self.under_test else 1)

    def close(self) -> None:
        self.keep_log()
        if self.proc.poll() is None:
            try:
                os.write(self._command_write, b'{"op": "exit"}\n')
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for fd in (self._command_write, self._answer_read):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.scratch and not isinstance(self.proc, zygote.ForkedProcess):
            scratch_folders.remove(self.scratch)  # a zygote's child's folder goes when it is reaped

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
