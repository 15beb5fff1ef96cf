"""What makes two processes alike, so that a parked one may serve a job in place of a new one
(the keys they are parked and adopted by), and what a process running an implementation reads.
Light on imports: the build's own process computes them too."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magpie.harness.wire import Implementation


def worker_key(load: dict, impl: Implementation, root: Path, build: str | None = None, **process) -> str:
    """What a parked worker must share with a new job's to stand in for it, in this build or a
    later one: "<how>/<what>". How: its load request but for the code, and how its process was
    started (folder, environment, memory limit, sandbox: what it hides too, so that no worker
    moves to a build whose store its sandbox leaves in sight). What: the bytes of every file it
    loaded, and the build where only that build may adopt it. A worker parked under a how with
    another what is its implementation's earlier content, or an earlier build's
    (`zygote.Children.stale`)."""
    how = hashlib.sha256(
        json.dumps({**load, "code": None, "init_inputs_file": None, **process}, sort_keys=True).encode()
    )
    what = hashlib.sha256(f"{build}:{load.get('code') or ''}".encode())
    files = [
        root / impl.source,
        *(root / f for f in impl.source_files),
        *(Path(p) for p in (load["library"], load["init_inputs_file"]) if p),
    ]
    for path in files:
        what.update(path.read_bytes() if path.is_file() else b"-")
    return f"worker-{how.hexdigest()[:16]}/{what.hexdigest()[:24]}"


def code_reads(root: Path, impl: dict, cwd: Path) -> list[str]:
    """What a sandboxed process running impl (the build's form of `wire.Implementation`) reads besides the system: the project, its working
    folder, the folders of its sources (which may lie outside the project) and of its compiled
    library (in the store, which is otherwise hidden)."""
    files = [root / impl["source"], *(root / f for f in impl.get("source_files") or [])]
    read = [str(root), str(cwd), *sorted({str(f.parent) for f in files})]
    if impl.get("library"):
        read.append(str(Path(impl["library"]).parent))
    return read


def evaluator_key(env: dict) -> str:
    """Evaluators started alike are alike: one may take any job of the build."""
    return "evaluator-" + hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:24]
