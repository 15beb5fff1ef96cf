"""magpie verify: check every artifact of the store against the digests recorded when it was written
and against its signature (its signer trusted: this machine's key or one configured)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check every artifact in the store against its recorded digests and signature",
        description="Hash every artifact in the project's store (all keys, current or not), "
        "compare its files with the sizes and sha256 recorded when it was written and "
        "check its signature over its task, key and digests. Prints one line per "
        "artifact that was modified, truncated, lost a file, has no recorded digest, is "
        "unsigned, fails its signature or was signed by a signer not trusted here (this "
        "machine's key, `magpie key`, and [store] trusted_signers), then a summary; "
        "exits 1 if there is any.",
    )
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument("--fix", action="store_true", help="remove the bad artifacts, so that the next build rebuilds them")
    p.add_argument("--json", action="store_true", help="print the findings as JSON on stdout")
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.project import Project
    from magpie.store import DIGEST

    project = Project.load(args.manifest)
    store = project.store
    # which task each key belongs to: the index's (current) records, else the artifact's own record
    owners = {spec.key: name for name, spec in project.tasks.items()}
    if store.index.is_dir():
        for path in store.index.glob("*.json"):
            record = store.recorded(unquote(path.name[: -len(".json")]))
            if record and isinstance(record.get("key"), str):
                owners.setdefault(record["key"], unquote(path.name[: -len(".json")]))
    keys = (
        sorted(
            folder.name
            for folder in store.objects.glob("*/*")
            if folder.is_dir() and not folder.name.startswith(".tmp-")
        )
        if store.objects.is_dir()
        else []
    )
    bad: list[dict] = []
    for key in keys:
        task = owners.get(key)
        if task is None:
            try:
                task = json.loads((store.path(key) / DIGEST).read_text()).get("task")
            except (OSError, ValueError, AttributeError):
                task = None
        problem = (
            store.check(key, task or "?", trust_stamps=False) if task else store.problem(key)
        )  # a task unknown: only the artifact's own record can say
        if problem is not None:
            current = task in project.tasks and project.tasks[task].key == key
            bad.append({"task": task, "key": key, "problem": problem, "current": current})
            if args.fix:
                store.remove(key)
    if args.json:
        print(json.dumps({"checked": len(keys), "bad": bad, "removed": bool(args.fix and bad)}, indent=1))
    else:
        for item in bad:
            print(
                f"bad  {item['task'] or '(unknown task)'}  {item['key'][:12]}  ({item['problem']})"
                f"{'  removed' if args.fix else ''}"
            )
        where = Path(store.objects)
        if bad:
            print(
                f"magpie: {len(bad)} of {len(keys)} artifacts in {where} do not match their recorded digests "
                f"or trusted signature"
                + ("; removed, the next build rebuilds them" if args.fix else "; magpie verify --fix removes them")
            )
        else:
            print(f"magpie: all {len(keys)} artifacts in {where} match their recorded digests and trusted signature")
    return 1 if bad else 0
