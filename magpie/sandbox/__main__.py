"""Run a program, or a Python module's main(), inside the sandbox:

    python -m magpie.sandbox POLICY_JSON -- PROGRAM ARGS...
    python -m magpie.sandbox POLICY_JSON --module MODULE ARGS...

Used for commands (compile rules, command testcases, profilers) and for workers started
without a zygote; the zygote runs its main() for command testcases."""

from __future__ import annotations

import importlib
import json
import os
import sys

from magpie.sandbox import Policy, enter_or_exit


def main(argv: list[str]) -> int:
    policy = json.loads(argv[0])  # null: trusted code, run as it is
    enter_or_exit(Policy.from_json(policy) if policy is not None else None)
    if argv[1] == "--module":
        sys.path.insert(0, os.getcwd())  # as `python -m` would have it for the code it runs
        sys.argv = argv[2:]
        return importlib.import_module(argv[2]).main(argv[3:]) or 0
    program = argv[2:]
    try:
        os.execvp(program[0], program)
    except OSError as err:
        print(f"sandbox: cannot run {program[0]}: {err.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
