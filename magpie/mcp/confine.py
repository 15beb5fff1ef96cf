"""Every path a tool is given is resolved (every symlink followed) and must stay inside the
project root; ids must be plain names. A refusal is a UserError, which a tool reports as its
one-line error."""

from __future__ import annotations

import os
import re
from pathlib import Path

from magpie.errors import UserError

# the manifest's own pattern for ids, bounded: an id names a folder and a task, never a path
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")


class Confinement:
    """The project root one server serves, and the checks that keep tools inside it."""

    def __init__(self, root: str | Path):
        self.root = Path(os.path.realpath(root))

    def path(self, text: str, field: str, *, must_exist: bool = True) -> Path:
        """`text`, relative to the root, as a real path inside it. Refused: an absolute path,
        one that leaves the root through `..` or a symlink, a NUL byte, one that is not there
        (where `must_exist`)."""
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{field}: give a path relative to the project root")
        if "\0" in text:
            raise UserError(f"{field}: a path may not hold a NUL byte")
        if os.path.isabs(text) or text.startswith("~"):
            raise UserError(f"{field}: {text!r} is absolute; give a path relative to the project root")
        real = Path(os.path.realpath(self.root / text))
        if not real.is_relative_to(self.root):
            raise UserError(f"{field}: {text!r} resolves outside the project root; only paths inside it are served")
        if must_exist and not real.exists():
            raise UserError(f"{field}: {text!r} is not there (paths are relative to the project root)")
        return real

    def paths(self, texts: list[str], field: str) -> list[Path]:
        return [self.path(text, f"{field}[{i}]") for i, text in enumerate(texts)]

    def relative(self, path: Path) -> str:
        return os.path.relpath(path, self.root)


def identifier(text: str, field: str) -> str:
    """A kernel, implementation, job or result id: a plain name, never a path."""
    if not isinstance(text, str) or not _ID.match(text):
        raise UserError(f"{field}: {text!r} is not an id (letters, digits, '_', '.', '-'; no path)")
    return text
