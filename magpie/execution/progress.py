"""What a build says while it runs, kept apart from what it returns."""

from __future__ import annotations

import contextlib
import os
from typing import TextIO


class Progress:
    """A build's running commentary on `stream` (the CLI passes stderr; None: said nowhere): a
    line per task started, done or failed (a rich bar over them where `bar`), each artifact
    found modified, and the line of a build stopped by a signal. The build's result is
    returned, never printed: a caller's stdout stays its own (`magpie build --json` prints
    only the summary there)."""

    def __init__(self, stream: TextIO | None = None, *, bar: bool = False, title: str = "magpie build"):
        self.stream = stream
        self.bar = bar and stream is not None
        self.title = title

    def line(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    def urgent(self, text: str) -> None:
        """A line from a signal handler: written with a write of its own where the stream has a
        descriptor, as the main thread may have been stopped inside one of the stream's writes."""
        if self.stream is None:
            return
        try:
            descriptor = self.stream.fileno()
        except (OSError, ValueError, AttributeError):  # an in-memory stream: no buffer of a file's to re-enter
            self.line(text)
            return
        with contextlib.suppress(OSError):
            os.write(descriptor, (text + "\n").encode())
