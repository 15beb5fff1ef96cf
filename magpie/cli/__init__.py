"""Command line: one module per verb, each with add_parser(subparsers) and run(args)."""

from __future__ import annotations

import argparse
import sys

from magpie import __version__
from magpie.errors import UserError

VERBS = (
    "build",
    "clean",
    "verify",
    "key",
    "cache",
    "analyze",
    "compare",
    "benchmark",
    "calibrate",
    "mcp",
    "kernel",
    "loop",
)


def parser() -> argparse.ArgumentParser:
    import importlib

    top = argparse.ArgumentParser(
        prog="magpie",
        description="Declarative build system for GPU kernel evaluation: correctness verdicts, timings, "
        "comparisons and reports, rebuilt only when their inputs change.",
    )
    top.add_argument("--version", action="version", version=f"magpie {__version__}")
    top.add_argument("--gpu-info", action="store_true", help="describe the devices, compilers and profilers found")
    top.add_argument("--json", action="store_true", help="with --gpu-info: print JSON")
    sub = top.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        importlib.import_module(f"magpie.cli.{verb}").add_parser(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from magpie.store.signing import take_secret_from_environment

        take_secret_from_environment()  # before any process is started: none inherits the store's key
        if args.gpu_info:
            from magpie.cli.gpu_info import run as gpu_info

            return gpu_info(args)
        if not args.verb:
            parser().print_help()
            return 2
        return args.run(args)
    except UserError as err:
        print(f"magpie: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("magpie: interrupted; finished artifacts are kept", file=sys.stderr)
        return 130
    except OSError as err:  # a read-only, foreign or full workspace: one line, not a traceback
        from magpie import workspace

        if not workspace.unwritable(err):
            raise
        print(f"magpie: {workspace.describe(err)}", file=sys.stderr)
        return 2


def command() -> None:
    """The `magpie` process (its console script, `python -m magpie`): main(), then out without
    the interpreter's teardown, which freed its modules one by one for 0.09-0.12 s after every
    build on the CPU machine (memory the system takes back whole at exit). What a normal exit
    does first is done: threads that are not daemons are waited for, atexit's functions run
    (the logging, multiprocessing's children), the output is flushed. Under a profiler or a
    debugger (`python -m cProfile -m magpie ...`), the usual exit."""
    import atexit
    import os
    import threading

    code = main()
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # a profiler or debugger around the command writes its findings after it
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a stream closed
            pass
    os._exit(code)
