"""Opening a pidfd by pid, for a process that may be gone, or whose pid may not be one."""

from __future__ import annotations

import errno
import os


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; None if no process has that pid (any more). Raises OSError
    for anything else (out of file descriptors, say).

    A pid whose process is gone while the number lives on as a process group's id (a
    reaped group leader with members), or has been taken as a thread's id, is EINVAL to
    kernels before 6.15; since, ESRCH and ENOENT (no process, a thread's id).
    """
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, FileNotFoundError):
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise
