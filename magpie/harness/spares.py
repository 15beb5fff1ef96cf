"""Spare workers: a process started like an implementation's worker, its CUDA context made,
waiting parked in the zygote with no code loaded, for the next job that needs a new worker
started alike (an edited candidate, kept warm: its new content has no parked worker). It
saves that job the context (0.29 s on the H200) and the sandbox's start.

A spare is a worker of no implementation yet, so it cannot be given that implementation's
compiler caches when it starts: it gets folders of its own, named after its scratch folder,
which the job that adopts it renames into the caches of what it loads. Landlock's rules and
the sandbox's bind mounts hold the folders, not their paths, so both hold after the rename
(and the spare, where a covering mount hides the new names, reaches them by the old); a cache that
exists already (the content was loaded before) is not the spare's to take, and a new worker
is started instead. A spare runs only magpie's code until it is adopted: it is parked as it
is, not stopped, and makes its context under a share of the device lock its starter took
for it (`device_lock.share_held`), so no measurement sees it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from magpie.paths import cache_root
from magpie.supervision import scratch as scratch_folders

PREFIX = "spare-"


def key(load: dict, build: str | None = None, **process) -> str:
    """What a spare must share with a new worker to become it: how its process was started
    (folder, environment, memory limit, sandbox) and the device and threads its load would
    set up; nothing of the code. No slash: a spare is in no implementation's slot."""
    how = {"device": load["device"], "threads": load.get("threads"), "build": build, **process}
    return PREFIX + hashlib.sha256(json.dumps(how, sort_keys=True).encode()).hexdigest()[:24]


def caches_folder(scratch: Path) -> Path:
    return cache_root() / "compiled" / f"{PREFIX}{scratch.name}"


def take_caches(scratch: Path | None, folder: Path) -> bool:
    """The adopted spare's compiler caches renamed into `folder` (an implementation's, which
    must not exist yet); False where they could not be."""
    if scratch is None:
        return False
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.rename(caches_folder(scratch), folder)
    except OSError:
        return False
    return True


def sweep_caches() -> None:
    """The caches of spares that ended unadopted (their scratch folder gone with them)."""
    for folder in (cache_root() / "compiled").glob(f"{PREFIX}*"):
        if not scratch_folders.exists(folder.name.removeprefix(PREFIX)):
            shutil.rmtree(folder, ignore_errors=True)
