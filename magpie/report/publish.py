"""Publishing: the current comparison, trace analysis and report artifacts copied to stable
paths under the workspace's reports/, each checked against its digests first."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def publish_project(project, warn: Callable[[str], None] = _to_stderr) -> list[str]:
    """publish() over every task of a loaded project."""
    return publish(
        project.store, [(name, spec.rule, spec.kernel, spec.key) for name, spec in project.tasks.items()], warn
    )


PUBLISHED = ("comparison", "report", "trace_analysis", "benchmark_trace_analysis", "benchmark_sweep")
# Analyses published whole, each to a folder of its own under reports/: rule -> folder
PUBLISHED_FOLDERS = {"trace_analysis": "traces", "benchmark_trace_analysis": "benchmarks", "benchmark_sweep": "sweeps"}
LEDGER = ".published.json"  # under reports/: task -> {"key": artifact key, "files": {published file: stat}}


def publish(
    store, artifacts: list[tuple[str, str, str | None, str]], warn: Callable[[str], None] = _to_stderr
) -> list[str]:
    """Copy the current comparison, trace analysis (of declared trace sets and of profiled
    benchmarks) and report artifacts to stable paths under reports/. What is there already
    from the same artifact, untouched since, is left alone (a no-op build reads no
    artifact); what is copied is checked against the artifact's digests first, and the
    bytes checked are the bytes written. Returns the tasks whose artifacts were found
    modified: announced (a line to `warn`), removed, and left for a build to rebuild."""
    from magpie.store import DIGEST, Modified, atomic_write

    out = store.workspace / "reports"
    try:
        ledger = json.loads((out / LEDGER).read_text())
    except (OSError, ValueError):
        ledger = {}
    ledger = ledger if isinstance(ledger, dict) else {}
    before, bad = json.dumps(ledger, sort_keys=True), []
    for name, rule, kernel, key in artifacts:
        if rule not in PUBLISHED or not store.has(key):
            continue
        # which commit of the artifact: one rebuilt under the same key (it was found modified)
        # is a new folder, and what it renders again (a report's date) is published again
        committed = json.dumps([key, _stat(store.path(key) / DIGEST)])
        if rule in PUBLISHED_FOLDERS:
            target = out / PUBLISHED_FOLDERS[rule] / name.split(":", 1)[1]
            stamp = target / ".artifact"
            if stamp.is_file() and stamp.read_text() == committed:
                continue  # published already: keeps the no-op build a stat or two per artifact
        elif _still_published(ledger.get(name), committed, out):
            continue
        try:
            contents = store.verified_files(key, name)
        except Modified as err:
            warn(str(err))
            store.remove(key)
            bad.append(name)
            continue
        if rule in PUBLISHED_FOLDERS:
            staging = target.parent / f".{target.name}.publishing"
            shutil.rmtree(staging, ignore_errors=True)
            for rel, data in contents.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_bytes(data)
            (staging / ".artifact").write_text(committed)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
            continue
        wanted = (
            {"result.json": f"{kernel}/compare_report.json"}
            if rule == "comparison"
            else {"report.html": "report.html", "summary.md": "summary.md"}
        )
        files = {}
        for produced, rel in wanted.items():
            if produced in contents:
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)  # a new file: never written through a link put there
                target.write_bytes(contents[produced])
                files[rel] = _stat(target)
        ledger[name] = {"key": committed, "files": files}
    if json.dumps(ledger, sort_keys=True) != before:
        atomic_write(out / LEDGER, json.dumps(ledger, sort_keys=True))
    return bad


def _still_published(entry, committed: str, out: Path) -> bool:
    """Whether the files published from this commit of the artifact are there, untouched since
    (a stat each)."""
    if not isinstance(entry, dict) or entry.get("key") != committed or not isinstance(entry.get("files"), dict):
        return False
    return bool(entry["files"]) and all(_stat(out / rel) == stat for rel, stat in entry["files"].items())


def _stat(path: Path) -> list | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def unpublish(project, names: list[str]) -> None:
    """Remove what was published under reports/ from these tasks (a comparison's
    compare_report.json, the report's html and summary, an analysis's folder): a verdict
    whose artifact is gone, or is about to be rebuilt from results that are, stays published
    nowhere. The next build publishes them again."""
    from magpie.store import atomic_write

    out = project.store.workspace / "reports"
    try:
        ledger = json.loads((out / LEDGER).read_text())
    except (OSError, ValueError):
        ledger = {}
    ledger = ledger if isinstance(ledger, dict) else {}
    changed = False
    for name in names:
        spec = project.tasks[name]
        if spec.rule not in PUBLISHED:
            continue
        if spec.rule in PUBLISHED_FOLDERS:
            shutil.rmtree(out / PUBLISHED_FOLDERS[spec.rule] / name.split(":", 1)[1], ignore_errors=True)
            continue
        entry = ledger.pop(name, None)
        changed |= entry is not None
        published = (entry or {}).get("files") if isinstance(entry, dict) else None
        files = (
            list(published)
            if isinstance(published, dict)
            else (
                [f"{spec.kernel}/compare_report.json"] if spec.rule == "comparison" else ["report.html", "summary.md"]
            )
        )
        for rel in files:
            (out / rel).unlink(missing_ok=True)
    if changed:
        atomic_write(out / LEDGER, json.dumps(ledger, sort_keys=True))
