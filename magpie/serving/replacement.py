"""A kernel put into a served model: the hook folder, the check before the server starts, the records after.

A `[[kernel]]` says what it replaces (`replaces`, a Python path such as
`transformers.models.llama.modeling_llama.LlamaRMSNorm.forward`, or `module:Qual.name`) and which function of an
implementation's source takes its place (`replaces_with`, default the kernel's entry: a function with the
target's own signature, `self` first for a method). A `[[benchmark]]`'s `use = { KERNEL = "best" | IMPL }` names
the implementation; `Replacement` is one of them resolved (source copied, digest, correctness verdict).

`write_hook(folder, replacements)` writes the mechanism (`replacement_hook.py`'s docstring): the hook module,
its plan, a `sitecustomize.py` (Python engines: `transformers serve` and the model process it spawns; the
environment's PYTHONPATH carries it into every process) and a `vllm.general_plugins` entry point (vLLM's
plugin route, called in its engine and worker processes: unverified, no vLLM here). `hook_environment` is
what the server's environment needs. `check_targets` runs the hook's `check()` in a fresh interpreter of the
engine's Python before any server starts; `installed(folder)` reads what the processes recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from magpie.serving import replacement_hook

HOOK_MODULE = "magpie_replacement_hook"
RECORDS = "records"
CHECKED = "targets_checked"  # check_targets passed for this folder's plan
DIST_INFO = "magpie_replacement-1.dist-info"


class ReplacementError(RuntimeError):
    """A replacement that cannot be put in; the message is one line."""


class Replacement(BaseModel):
    """One implementation put in place of a target, as the report's provenance records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kernel: str
    implementation: str
    chosen_by: str  # "best" (the comparison's winner) or "named"
    target: str
    function: str
    source_name: str  # as the manifest gives it, relative to magpie.toml
    source_digest: str  # sha256 of the source the engine loads
    correctness_state: str
    speedup: dict | None = None  # the comparison's paired micro-benchmark speedup, None for the baseline


def source_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_hook(folder: Path, replacements: list[Replacement], root: Path, snapshots: str | None = None) -> Path:
    """The hook folder for these replacements (their sources copied in, so an edit during the run changes
    nothing the engine loads): each the bytes of its digest, from the build's snapshots where they are kept
    (graph/expand.py's `snapshot_path` layout), else the file if it still has that digest. Returns the folder;
    one already holding this plan is left as it is: a kept server started on it goes on reading it."""
    folder = Path(folder).resolve()
    plan = {
        "records": str(folder / RECORDS),
        "replacements": [
            {
                **r.model_dump(include={"kernel", "implementation", "target", "function", "source_name"}),
                "source_digest": r.source_digest,
                "source": str(folder / "sources" / f"{r.source_digest}.py"),
            }
            for r in replacements
        ],
    }
    text = json.dumps(plan, indent=1) + "\n"
    plan_path = folder / replacement_hook.PLAN
    if plan_path.is_file() and plan_path.read_text() == text:
        return folder
    (folder / "sources").mkdir(parents=True, exist_ok=True)
    for r in replacements:
        kept = Path(snapshots) / r.source_digest[:2] / r.source_digest if snapshots else None
        data = (kept if kept is not None and kept.is_file() else Path(root) / r.source_name).read_bytes()
        if hashlib.sha256(data).hexdigest() != r.source_digest:
            raise ReplacementError(
                f"{r.source_name} changed since its implementation {r.kernel}/{r.implementation} was judged: "
                f"build again"
            )
        (folder / "sources" / f"{r.source_digest}.py").write_bytes(data)
    shutil.copyfile(replacement_hook.__file__, folder / f"{HOOK_MODULE}.py")
    # A sitecustomize of the environment's that ours shadows is still run, after ours.
    (folder / "sitecustomize.py").write_text(
        "# magpie: puts a kernel into this process (magpie_replacement_hook.py says how)\n"
        f"import {HOOK_MODULE}\n\n{HOOK_MODULE}.install()\n"
        "import importlib.util as _u, os as _o, sys as _s\n\n"
        "_here = _o.path.dirname(_o.path.abspath(__file__))\n"
        "_rest = [p for p in _s.path if _o.path.abspath(p or '.') != _here]\n"
        "_spec = _u.spec_from_file_location('_shadowed_sitecustomize', next(\n"
        "    (_o.path.join(p, 'sitecustomize.py') for p in _rest if _o.path.isfile(_o.path.join(p, 'sitecustomize.py'))),\n"
        "    _o.devnull))\n"
        "if _spec is not None and _spec.origin != _o.devnull:\n"
        "    _spec.loader.exec_module(_u.module_from_spec(_spec))\n"
    )
    dist = folder / DIST_INFO
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: magpie-replacement\nVersion: 1\n")
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\nmagpie_replacement = {HOOK_MODULE}:install\n")
    shutil.rmtree(folder / RECORDS, ignore_errors=True)
    (folder / CHECKED).unlink(missing_ok=True)
    tmp = plan_path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(plan_path)
    return folder


def hook_environment(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """The server's environment with the hook folder first on its PYTHONPATH (the one given, else magpie's)."""
    current = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), *([current] if current else [])])}


def check_targets(folder: Path, python: str, env: dict[str, str], timeout_s: float = 300.0) -> None:
    """The hook's `check()` in a fresh interpreter of the engine's Python with the server's environment: every
    target imported and found, every implementation loaded. Raises ReplacementError with its one line."""
    full = {**os.environ, **hook_environment(folder, env)}
    try:
        proc = subprocess.run(
            [python, "-c", f"import {HOOK_MODULE} as h; h.check()"],
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=folder,
        )
    except subprocess.TimeoutExpired:
        raise ReplacementError(f"checking the replacement's targets took over {timeout_s:.0f} s") from None
    # the checking process ran the hook too: its records must not pass for a server's
    shutil.rmtree(Path(folder) / RECORDS, ignore_errors=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ReplacementError(lines[-1] if lines else f"the replacement check exited with code {proc.returncode}")
    (Path(folder) / CHECKED).touch()


def checked(folder: Path) -> bool:
    """Whether check_targets passed for the folder's plan (rewriting the plan forgets it)."""
    return (Path(folder) / CHECKED).is_file()


def records(folder: Path) -> dict[str, list[dict]]:
    """What the engine's processes recorded: `installed`, `called` and `failed` records, each a list."""
    out: dict[str, list[dict]] = {"installed": [], "called": [], "failed": []}
    for path in sorted((Path(folder) / RECORDS).glob("*.json")):
        kind = path.name.split(".")[-2]
        if kind in out:
            try:
                out[kind].append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    return out


def verify_installed(folder: Path, replacements: list[Replacement]) -> dict:
    """After requests were served: each replacement was patched in and called in a process of the engine, and
    none failed to install; else ReplacementError's one line. Returns the records, for the provenance."""
    found = records(folder)
    if found["failed"]:
        first = found["failed"][0]
        raise ReplacementError(
            f"the replacement of {first['target']!r} failed to install in the server's process {first['pid']}: "
            f"{first['error']}"
        )
    for r in replacements:
        mine = [x for x in found["called"] if x["target"] == r.target and x["implementation"] == r.implementation]
        if not mine:
            patched = [x for x in found["installed"] if x["target"] == r.target]
            raise ReplacementError(
                f"{r.kernel}/{r.implementation} in place of {r.target!r} was "
                + (
                    "installed but never called: the served model does not run that target"
                    if patched
                    else "not installed in any process of the server (its hook did not run there)"
                )
            )
    return {
        "installed_pids": sorted({x["pid"] for x in found["installed"]}),
        "called_pids": sorted({x["pid"] for x in found["called"]}),
    }
