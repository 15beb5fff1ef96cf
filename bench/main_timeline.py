"""A magpie command run with a timeline of its own process: when it first imported the modules
that mark its stages, each socket it connected (the zygote, the job pool's server), each
process it forked, each store commit and report written. Times are seconds after the unix
time in $MAGPIE_TIMELINE_T0 (the caller's start), else after this script's start.
Usage: python bench/main_timeline.py OUT.json -- magpie-arguments...
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time

# taken out of the environment: the zygote a build finds is keyed by the variables it passes on
T0 = float(os.environ.pop("MAGPIE_TIMELINE_T0", None) or time.time())
STAGE_MODULES = {
    "magpie.cli",
    "magpie.cli.compare",
    "magpie.execution.pool",
    "multiprocessing.forkserver",
    "pydantic",
    "magpie.manifest.models",
    "magpie.project",
    "doit",
    "magpie.execution.doit_glue",
    "magpie.supervision.zygote",
    "magpie.sandbox",
    "concurrent.futures.process",
    "magpie.store",
    "json",
}


def main() -> None:
    out = sys.argv[1]
    if sys.argv[2] != "--":
        raise SystemExit(__doc__)
    events: list[tuple[float, str, str]] = [(time.time() - T0, "start", "")]

    def hook(event: str, args: tuple) -> None:
        if event == "import" and args[0] in STAGE_MODULES:
            events.append((time.time() - T0, "import", args[0]))
        elif event == "socket.connect":
            events.append((time.time() - T0, "connect", str(args[1])[-60:]))
        elif event == "os.fork":
            events.append((time.time() - T0, "fork", ""))
        elif event in ("os.rename", "os.replace") and ("store" in str(args[1]) or "report" in str(args[1])):
            events.append((time.time() - T0, "commit", str(args[1])[-80:]))
        elif event == "open" and isinstance(args[0], str) and args[0].endswith("_report.json") and "w" in str(args[1]):
            events.append((time.time() - T0, "write", args[0][-60:]))

    def dump() -> None:
        events.append((time.time() - T0, "exit", ""))
        with open(out, "w") as handle:
            json.dump([{"t": round(t, 4), "event": e, "what": w} for t, e, w in events], handle, indent=0)

    sys.addaudithook(hook)
    atexit.register(dump)
    sys.argv = ["magpie", *sys.argv[3:]]
    runpy.run_module("magpie", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
