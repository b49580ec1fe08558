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

#: The exit status of a tool whose report could not be written (not to a reader that left:
#: that ends it as by SIGPIPE). Not 0 nor 1: a check must not take it for its answer.
REPORT_LOST = 2


class ReportLost(Exception):
    """The tool's report could not be written to its stdout: a full disk, a closed stdout."""


def say(report: str) -> None:
    """Write the tool's report to stdout, now. A reader that left raises `BrokenPipeError`;
    any other failure `ReportLost` (left to the flush at exit, a lost report went unsaid
    with status 0 where Python buffers stdout, or with a traceback where it does not)."""
    try:
        sys.stdout.write(report)  # (None, a stdout closed when we started: AttributeError)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (AttributeError, OSError, ValueError) as exc:
        drop_said(sys.stdout)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "stdout is closed"
        raise ReportLost(why) from exc


def complain(message: str) -> None:
    """Say ``message`` on stderr as the tool's. Unsaid where stderr is closed (None) or
    cannot be written (full): the exit status still says it. (Raised, it made the status
    1, the command's own as far as anyone could tell: helper-70.) Not a reader that left:
    that ends the tool as by SIGPIPE (`main`)."""
    say_on_stderr(f"trio-proctree: {message}\n")


def say_on_stderr(text: str) -> None:
    """`complain`, for text that says who says it itself (argparse's usage errors)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except BrokenPipeError:
        raise
    except (AttributeError, OSError, ValueError):
        pass  # (what stays in the buffer is dropped by `flush_said`)


def flush_said(*, ending_by_signal: bool = False) -> None:
    """Flush stdout and stderr now. A reader that left raises `BrokenPipeError` (the caller
    ends as by SIGPIPE), unless the tool is ``ending_by_signal`` anyway (a Ctrl-C that
    ended the reader too: the signal wins); what cannot be said otherwise (a full disk,
    a closed stream) is dropped: the exit status still says what happened."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # (None, a closed stream: AttributeError, ValueError)
        except BrokenPipeError:
            if not ending_by_signal:
                raise
            drop_said(stream)
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
