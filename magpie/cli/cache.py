"""magpie cache push / pull / key: share the project's artifacts through a cache folder (store/cache.py),
and name the toolchain and device they are keyed by (a CI cache's key)."""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "cache",
        help="put the project's artifacts into a shared cache, or take what the store lacks from it",
        description="A shared cache is a folder (a network mount, the folder a CI cache action restores "
        "and saves). pull takes from it the artifacts of the project's current keys that the store "
        "lacks, each checked first (its files against its digests, its signature by a trusted signer: "
        "this machine's key, [store] trusted_signers, the user's trusted-signers file); one that fails "
        "is named and not used (exit 1). push puts the store's artifacts of the current keys into it: only with "
        "--cache-write (or [store] cache_write = true) and only from a builder whose signer is trusted.",
    )
    p.add_argument(
        "action",
        choices=("push", "pull", "key"),
        help="push: store to cache; pull: cache to store; key: the toolchain and device this machine keys "
        "artifacts by, as one name (a CI cache's key: caches of other toolchains hold nothing of use here)",
    )
    p.add_argument("targets", nargs="*", help="kernel ids or task names (default: everything)")
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument("--cache", help="the cache folder (default: [store] cache of magpie.toml)")
    p.add_argument(
        "--cache-write",
        action="store_true",
        default=None,
        help="allow writing the cache (push); read-only by default",
    )
    p.add_argument("--json", action="store_true", help="print what was pushed or pulled as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.errors import UserError
    from magpie.execution.shared_cache import cache_of
    from magpie.project import Project
    from magpie.store.cache import pull, push

    project = Project.load(args.manifest)
    if args.action == "key":
        print(toolchain_key(project.manifest.project.device))
        return 0
    selected = project.select(args.targets)
    if args.action == "pull" and args.cache_write:
        raise UserError("--cache-write: only with push (pull never writes the cache)")
    remote = cache_of(project, args.cache, args.cache_write if args.action == "push" else False)
    if remote is None:
        raise UserError(f"{args.manifest}: no cache: give --cache FOLDER, or [store] cache in magpie.toml")

    def warn(line: str) -> None:
        print(line, file=sys.stderr)

    if args.action == "pull":
        if not remote.exists():
            warn(f"cache: {remote.where} holds nothing yet (no such folder)")
        from magpie.graph import snapshot

        saved = snapshot.save(project)  # the inputs' stat as the keys were computed from them
        taken = pull(project, selected, remote, warn)
        snapshot.save(project, saved)  # and the stamps of what was taken, checked: the next build a no-op
        report = {"pulled": taken.taken, "rejected": [{"task": t, "problem": p} for t, p in taken.rejected]}
        line = f"magpie: {len(taken.taken)} artifacts taken from {remote.where}, each checked" + (
            f"; {len(taken.rejected)} not used" if taken.rejected else ""
        )
    else:
        put = push(project, selected, remote, warn)
        report = {
            "pushed": put.put,
            "present": put.present,
            "skipped": [{"task": t, "why": w} for t, w in put.skipped],
        }
        line = f"magpie: {len(put.put)} artifacts put into {remote.where}, {put.present} there already" + (
            f", {len(put.skipped)} not pushed" if put.skipped else ""
        )
    print(json.dumps(report, indent=1) if args.json else line)
    return 1 if report.get("rejected") else 0


def toolchain_key(device: str) -> str:
    """Every toolchain and device fact artifacts are keyed by (graph/fingerprint.py), hashed."""
    import hashlib

    from magpie.graph.fingerprint import _FACTS, fingerprint

    facts = {name: fingerprint(name, device) for name in sorted(_FACTS)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
