"""A build's use of a shared cache (store/cache.py): which one, what is taken from it before the
build runs its stale tasks, and what is put into it after."""

from __future__ import annotations

from pathlib import Path

from magpie.execution.progress import Progress
from magpie.store.cache import Remote, open_cache, pull, push, refuse_untrusted_writer


def cache_of(project, location: str | None, write: bool | None) -> Remote | None:
    """`--cache` (relative to the current folder), else `[store] cache` (relative to magpie.toml's
    folder); written where `--cache-write` or `[store] cache_write` says so. None: no cache."""
    settings = project.manifest.store
    if location is not None:
        remote = open_cache(location, Path.cwd(), writable=False, source="--cache")
    elif settings.cache is not None:
        remote = open_cache(
            settings.cache, project.root, writable=False, source=f"{project.manifest_path}: store.cache"
        )
    else:
        return None
    remote.writable = bool(settings.cache_write if write is None else write)
    if remote.writable:  # refused before anything is built, not after
        refuse_untrusted_writer(project.store, remote)
    return remote


def take_from_cache(project, selected: list[str], remote: Remote, progress: Progress) -> None:
    """The artifacts the build lacks, from the cache where it has them (each checked first)."""
    taken = pull(project, selected, remote, progress.line)
    if taken.taken:
        progress.line(f"cache: {len(taken.taken)} artifacts taken from {remote.where}, each checked")


def put_into_cache(project, selected: list[str], remote: Remote, progress: Progress) -> None:
    put = push(project, selected, remote, progress.line)
    if put.put:
        progress.line(f"cache: {len(put.put)} artifacts put into {remote.where}")
