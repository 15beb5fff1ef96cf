"""Runs a Python server CLI inside a torch profiler window started and stopped by signals.

    python -m magpie.serving.torch_launcher -- transformers serve MODEL --port N ...

The command after `--` is run in this process (its first word names a console script, or
`python -m MODULE`), so the profiler sees the server's own ops. SIGUSR1 starts a
`torch.profiler.profile` (CPU, plus CUDA where a GPU is there, shapes recorded, every thread: the
server's model runs on its own inference thread, not on the main one); SIGUSR2 stops it
and writes a Chrome trace `<host>_<pid>.<n>.pt.trace.json` into `$MAGPIE_TORCH_TRACE_DIR` (written
under a `.tmp` name, then renamed). Each start/stop pair is one window, one file.
"""
from __future__ import annotations

import os
import runpy
import shutil
import signal
import socket
import sys
import threading
from importlib import metadata
from pathlib import Path

_state = {"prof": None, "n": 0}
_lock = threading.Lock()


def _start(signum, frame) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with _lock:
        if _state["prof"] is not None:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        prof = profile(activities=activities, record_shapes=True, **_all_threads())
        prof.start()
        _state["prof"] = prof
    print("magpie torch_launcher: profiler started", file=sys.stderr, flush=True)


def _all_threads() -> dict:
    """The profiler records every thread's ops (the server's inference thread is not the one the signal
    lands on) where this torch can (`_ExperimentalConfig(profile_all_threads=True)`, torch >= 2.8)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        print("magpie torch_launcher: this torch profiles only the thread that starts the profiler",
              file=sys.stderr, flush=True)
        return {}


def _stop(signum, frame) -> None:
    with _lock:
        prof, _state["prof"] = _state["prof"], None
    if prof is None:
        return
    prof.stop()
    folder = Path(os.environ.get("MAGPIE_TORCH_TRACE_DIR", "torch_trace"))
    folder.mkdir(parents=True, exist_ok=True)
    _state["n"] += 1
    final = folder / f"{socket.gethostname()}_{os.getpid()}.{_state['n']}.pt.trace.json"
    tmp = final.with_name(final.name + ".tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(final)
    print(f"magpie torch_launcher: trace written: {final}", file=sys.stderr, flush=True)


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
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
    if os.path.basename(argv[0]).startswith("python") and argv[1:2] == ["-m"] and len(argv) > 2:
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return
    func = _entry(argv[0])
    if func is None:
        raise SystemExit(f"torch_launcher: {argv[0]!r} is no console script of this Python "
                         f"({shutil.which(argv[0]) or 'not on PATH'}); give python -m MODULE")
    sys.argv = [argv[0], *argv[1:]]
    sys.exit(func())


if __name__ == "__main__":
    main(sys.argv[1:])
