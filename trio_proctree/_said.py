"""What the command-line tool says, flushed while a failure to say it can still be handled.

Python buffers ``sys.stdout`` and ``sys.stderr`` when they are a pipe or a file (unless
``PYTHONUNBUFFERED`` is set): a write to a reader that left, or to a full disk, then fails
only in the interpreter's flush at exit, which says "Exception ignored" and exits with 120,
a status that looks like the command's own.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


def flush_said() -> None:
    """Flush stdout and stderr now. A reader that left raises `BrokenPipeError` (the caller
    ends as by SIGPIPE); what cannot be said otherwise (a full disk, a closed stream) is
    dropped: the exit status still says what happened."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # (None, a closed stream: AttributeError, ValueError)
        except BrokenPipeError:
            raise
        except (AttributeError, OSError, ValueError):
            drop_said(stream)


def drop_said(stream: TextIO | None) -> None:
    """Send what ``stream`` holds, and whatever is written to it from here, nowhere: its
    buffer cannot be emptied otherwise, and the flush at exit would fail on it again."""
    if stream is None:  # (its descriptor was closed when we started: nothing to drop)
        return
    with contextlib.suppress(OSError, ValueError):  # (no descriptor left, or closed since)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
