"""Runs a Python server CLI under torch profiler windows started and stopped by signals.

    python -m magpie.serving.torch_launcher -- transformers serve MODEL --port N ...

The command after `--` is run in this process (its first word names a console script, or
`python -m MODULE`). SIGUSR1 opens a window, SIGUSR2 closes it. A window is recorded in the processes
that run the model: this one where the server runs the model in itself (transformers before 5.x), else
the processes it starts through `multiprocessing` (transformers 5.25 loads the model in a spawned
"model" process; its own process then only parses HTTP). Each recording process runs a
`torch.profiler.profile` (CPU, plus CUDA where a GPU is there, shapes recorded, every thread) and on
the close writes its own Chrome trace `<host>_<pid>.<n>.pt.trace.json` into `$MAGPIE_TORCH_TRACE_DIR`
(under a `.tmp` name, then renamed).

How the processes are followed: the launcher blocks both signals in its main thread before the
server starts, so every thread and process the server makes inherits the block (a stray signal can
kill none of them), and takes them on a thread of its own with `sigwait`, whatever thread the server
runs on. `multiprocessing.Process.start` is patched so that each child runs `_run_followed` around
its target: it does the same (its own signal thread, its own children followed) before the target
runs. The launcher's signal thread forwards each signal to its living children.

`<pid>.recording` in the trace folder says that process's window is open: it is written once the
process's profiler, or every child it forwarded the opening to, is recording (so the opening of the
launcher's marker means the whole tree records), and removed once its trace is in place. The client
(`magpie.serving.profiling`) waits for the launcher's marker after SIGUSR1, and for no marker left
after SIGUSR2. A process started while a window is open records from the next window.
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import socket
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

from magpie.environment import TORCH_TRACE_DIR
from magpie.serving.profiling import MARKER_SUFFIX, START_SIGNAL, STOP_SIGNAL

SIGNALS = {START_SIGNAL, STOP_SIGNAL}
CHILD_OPEN_WAIT_S = 60.0

_state: dict = {"prof": None, "open": False, "n": 0}
_children: list = []  # the multiprocessing children this process started and follows


def _say(message: str) -> None:
    print(f"magpie torch_launcher [{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _trace_dir() -> Path:
    return Path(os.environ.get(TORCH_TRACE_DIR, "torch_trace"))


def _marker(pid: int) -> Path:
    return _trace_dir() / f"{pid}{MARKER_SUFFIX}"


def _live_children() -> list:
    alive = []
    for child in _children:
        try:
            if child.is_alive():
                alive.append(child)
        except ValueError:  # closed by its owner: it is gone
            pass
    _children[:] = alive
    return alive


def _forward(children: list, signum: int) -> None:
    for child in children:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass


def _open() -> None:
    if _state["open"]:
        return
    children = _live_children()
    _forward(children, START_SIGNAL)
    if not children:
        _state["prof"] = _start_profiler()
    _state["open"] = True
    deadline = time.monotonic() + CHILD_OPEN_WAIT_S
    waiting = list(children)
    while True:
        waiting = [c for c in waiting if not _marker(c.pid).exists() and c.is_alive()]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if waiting:
        _say(
            f"child process(es) {', '.join(str(c.pid) for c in waiting)} did not open their profiler within "
            f"{CHILD_OPEN_WAIT_S:g} s"
        )
    marker = _marker(os.getpid())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    _say(
        "profiler started"
        if not children
        else f"profiler window open in child process(es) {', '.join(str(c.pid) for c in children)}"
    )


def _start_profiler():
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities, record_shapes=True, **_all_threads())
    prof.start()
    return prof


def _all_threads() -> dict:
    """The profiler records every thread's ops (the model does not run on the thread that starts the
    profiler) where this torch can (`_ExperimentalConfig(profile_all_threads=True)`, torch >= 2.8)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        _say("this torch profiles only the thread that starts the profiler")
        return {}


def _close() -> None:
    if not _state["open"]:
        return
    _forward(_live_children(), STOP_SIGNAL)
    prof, _state["prof"] = _state["prof"], None
    if prof is not None:
        prof.stop()
        folder = _trace_dir()
        folder.mkdir(parents=True, exist_ok=True)
        _state["n"] += 1
        final = folder / f"{socket.gethostname()}_{os.getpid()}.{_state['n']}.pt.trace.json"
        tmp = final.with_name(final.name + ".tmp")
        prof.export_chrome_trace(str(tmp))
        tmp.replace(final)
        _say(f"trace written: {final}")
    _marker(os.getpid()).unlink(missing_ok=True)
    _state["open"] = False


def _watch_signals() -> None:
    while True:
        signum = signal.sigwait(SIGNALS)
        try:
            _open() if signum == START_SIGNAL else _close()
        except Exception as exc:  # a failed window must not end the server; the client sees no trace
            _say(f"profiler window failed: {type(exc).__name__}: {exc}")


def _take_signals() -> None:
    """Blocks the signals in this thread (threads and processes made from here on inherit it) and takes
    them on a thread of their own."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    threading.Thread(target=_watch_signals, name="magpie-profiler-signals", daemon=True).start()


def _follow_children() -> None:
    """Makes every `multiprocessing` child started from here on run `_run_followed` around its target (a
    child that overrides `run()` has no target to wrap and is not followed)."""
    from multiprocessing import process

    original = process.BaseProcess.start
    if getattr(original, "magpie_follows", False):
        return

    def start(self) -> None:
        if self._target is not None:
            self._target, self._args, self._kwargs = _run_followed, (self._target, self._args, dict(self._kwargs)), {}
            _children.append(self)
        original(self)

    start.magpie_follows = True
    process.BaseProcess.start = start


def _run_followed(target, args: tuple, kwargs: dict):
    """A followed child's entry: its own signal thread and followed children, then its target."""
    _state.update(prof=None, open=False, n=0)  # a forked child's copy of its parent's window is not its own
    _children.clear()
    _follow_children()
    _take_signals()
    return target(*args, **kwargs)


def _entry(word: str):
    """The callable a console script named `word` runs, or None."""
    name = os.path.basename(word)
    for ep in metadata.entry_points(group="console_scripts"):
        if ep.name == name:
            return ep.load()
    return None


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m magpie.serving.torch_launcher -- COMMAND ...")
    _follow_children()
    _take_signals()
    if os.path.basename(argv[0]).startswith("python") and argv[1:2] == ["-m"] and len(argv) > 2:
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return
    func = _entry(argv[0])
    if func is None:
        raise SystemExit(
            f"torch_launcher: {argv[0]!r} is no console script of this Python "
            f"({shutil.which(argv[0]) or 'not on PATH'}); give python -m MODULE"
        )
    sys.argv = [argv[0], *argv[1:]]
    sys.exit(func())


if __name__ == "__main__":
    # run from the module by its own name, so that a child's entry (`_run_followed`) pickles by a name the
    # child can import (as `__main__` it would resolve to the server's main module there)
    from magpie.serving import torch_launcher

    torch_launcher.main(sys.argv[1:])
