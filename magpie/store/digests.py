"""Content digests of large files, remembered by their stat: a file is read again only when it may have changed.

A task's key holds the sha256 of every input file. For a model folder's weights (several GB) reading them on
every full load of the project would cost seconds per gigabyte, so `FileDigests` remembers, per absolute path,
the stat the file had when it was hashed — device, inode, size, mtime_ns, ctime_ns — with its sha256, in one
JSON file (the store's `file-digests.json`, or a per-user one for runs outside a build). A file whose stat is
the remembered one gets the remembered digest without being read; any change of the stat (a write, a
replacement by rename, a copy, a `touch`, a chmod) means it is hashed again.

Content can change under an unchanged stat only when a write lands within the clock tick of the write before
it, with the size unchanged (git's "racily clean" files). So a digest is remembered only for a file whose
mtime and ctime were at least `SETTLED_S` old when its hashing began and whose stat did not move while it was
read: a file still being written is hashed again next time. Losing the JSON (or a concurrent writer's entries)
only costs a rehash.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

SETTLED_S = 2.0
CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's content, read in 1 MiB chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def user_digests_path() -> Path:
    """Where runs outside a build (the one-shot benchmark's provenance) remember digests."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "magpie" / "file-digests.json"


class FileDigests:
    """sha256 of files, remembered by stat in the JSON file `path` (kept in memory alone when None)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self._entries: dict[str, list] = self._read()
        self._dirty = False
        self.hashed_bytes = 0  # what this instance read: 0 on a fully remembered load

    def _read(self) -> dict[str, list]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def digest(self, path: str | Path) -> str:
        """The file's sha256 (raises FileNotFoundError like open)."""
        name = os.path.abspath(path)
        before = os.stat(name)
        identity = _identity(before)
        entry = self._entries.get(name)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == identity:
            return entry[1]
        started_ns = time.time_ns()
        value = sha256_file(name)
        self.hashed_bytes += before.st_size
        settled = started_ns - max(before.st_mtime_ns, before.st_ctime_ns) >= SETTLED_S * 1e9
        if settled and _identity(os.stat(name)) == identity:
            self._entries[name] = [identity, value]
            self._dirty = True
        return value

    def save(self) -> None:
        """Writes what was learnt, merged over what another process may have written since; entries of files
        that are gone are dropped (a stat each), so the file holds no more than the files it describes."""
        if self.path is None or not self._dirty:
            return
        from magpie.store import atomic_write

        merged = {name: entry for name, entry in {**self._read(), **self._entries}.items() if os.path.exists(name)}
        atomic_write(self.path, json.dumps(merged, separators=(",", ":")))
        self._entries, self._dirty = merged, False
