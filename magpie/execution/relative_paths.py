"""A task's result and files as the project sees them: paths inside the project root written
relative to it, so what a build stores and publishes (result.json, compare_report.json, the
reports, a trace analysis's tables) reads the same on every machine and in every clone, and
does not tell a reader where the building machine keeps the project."""

from __future__ import annotations

import os
import re
from typing import Any

# The files of an artifact that hold text a person or a script reads; anything else (a compiled
# library, a trace, a picture) is kept byte for byte.
TEXT_SUFFIXES = (".json", ".md", ".html", ".csv", ".txt", ".log")


class ProjectPaths:
    """Rewrites the project root where it starts a path: "ROOT/kernels/a.py" -> "kernels/a.py",
    "ROOT" alone -> "."; a longer name that only begins like the root ("ROOT2/x") is left as it
    is, and so are paths outside the project."""

    def __init__(self, root: str):
        spellings = {os.path.abspath(root), os.path.realpath(root)} - {"/"}
        alternatives = "|".join(re.escape(s) for s in sorted(spellings, key=len, reverse=True))
        # the root, then either a separator (a path inside it) or no character a name may hold
        self._pattern = re.compile(f"(?:{alternatives})(/|(?![\\w.\\-]))") if alternatives else None

    def text(self, value: str) -> str:
        if self._pattern is None:
            return value
        return self._pattern.sub(lambda m: "" if m.group(1) == "/" else ".", value)

    def value(self, value: Any) -> Any:
        """The same JSON-like value with every string rewritten (keys too)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.value(v) for v in value)
        return value

    def files(self, files: dict[str, bytes]) -> dict[str, bytes]:
        """Text files rewritten; a file that is not UTF-8 kept as it is."""
        out = {}
        for name, data in files.items():
            if name.endswith(TEXT_SUFFIXES):
                try:
                    data = self.text(data.decode("utf-8")).encode("utf-8")
                except UnicodeDecodeError:
                    pass
            out[name] = data
        return out
