"""Content-addressed artifact store under the workspace.

An artifact is a folder `store/<key[:2]>/<key>/` holding `result.json` and any files the
action produced. It is built in a temporary folder beside it and renamed into place, so
an artifact either exists whole or not at all; a killed build leaves only temp folders,
which the next build removes. The store is plain files: copy it and the cache travels.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

RESULT = "result.json"


class Store:
    def __init__(self, workspace: Path):
        self.workspace = Path(workspace)
        self.objects = self.workspace / "store"
        self.index = self.workspace / "index"

    def path(self, key: str) -> Path:
        return self.objects / key[:2] / key

    def has(self, key: str) -> bool:
        return os.path.isdir(self.objects / key[:2] / key)

    def read(self, key: str) -> dict:
        return json.loads((self.path(key) / RESULT).read_text())

    def commit(self, key: str, result: dict, files: dict[str, bytes]) -> Path:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=final.parent))
        try:
            for name, data in files.items():
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (tmp / RESULT).write_text(json.dumps(result, indent=1, sort_keys=True))
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # lost a race to an identical artifact otherwise
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def remove(self, key: str) -> bool:
        path = self.path(key)
        if path.is_dir():
            shutil.rmtree(path)
            return True
        return False

    def sweep_temporaries(self) -> int:
        """Remove what a killed build left half-written."""
        count = 0
        if self.objects.is_dir():
            for tmp in self.objects.glob("*/.tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
                count += 1
        return count

    # The index remembers, per task name, the key and the parts of the key of its last
    # build: `--dry-run` uses it to say why a task would run, reports to find artifacts.
    def _index_file(self, task_name: str) -> Path:
        return self.index / (quote(task_name, safe="") + ".json")

    def record(self, task_name: str, key: str, parts: dict) -> None:
        self.index.mkdir(parents=True, exist_ok=True)
        atomic_write(self._index_file(task_name), json.dumps({"key": key, "parts": parts}, sort_keys=True))

    def recorded(self, task_name: str) -> dict | None:
        try:
            return json.loads(self._index_file(task_name).read_text())
        except (OSError, ValueError):
            return None

    def forget(self, task_name: str) -> None:
        try:
            self._index_file(task_name).unlink()
        except FileNotFoundError:
            pass


def atomic_write(path: Path, text: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

