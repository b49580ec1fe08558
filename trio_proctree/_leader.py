"""The tree's first process: its exit status read without reaping it, and the final reap.

The leader's zombie is what keeps its process group id reserved: while it is unreaped, no
new process can get that pid, so no new group can get that pgid, and ``killpg`` on it can
only reach our tree. So nothing here reaps until the drivers say the last group signal
has been sent.
"""

from __future__ import annotations

import logging
import os
import subprocess

logger = logging.getLogger("trio_proctree")

# waitid() options that report an exit without consuming it (the zombie stays).
_PEEK = os.WEXITED | os.WNOHANG | os.WNOWAIT


def _decode(info: os.waitid_result) -> int:
    """The exit status as `subprocess` reports it: the code, or minus the killing signal."""
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class Leader:
    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int) -> None:
        self.popen = popen
        self.pid = popen.pid
        #: Readable once the leader has exited; owned by the tree, closed after the reap.
        self.pidfd = pidfd
        self._returncode: int | None = None
        self.reaped = False
        #: Someone else (an ``os.wait()`` elsewhere in the program) reaped the leader: its
        #: process group id is no longer pinned and must not be signalled.
        self.lost = False

    def poll(self) -> int | None:
        """The leader's exit status, or None while it runs. Never reaps."""
        if self._returncode is None and not self.lost:
            try:
                # By pidfd, not pid: if someone else reaped the leader and its pid went to
                # another child of ours, waitid(P_PID) would report on that one instead.
                info = os.waitid(os.P_PIDFD, self.pidfd, _PEEK)
            except ChildProcessError:
                self.lost = True
                logger.warning(
                    "pid %d was reaped by someone else: its exit status is lost and its "
                    "process group can no longer be signalled safely",
                    self.pid,
                )
                return None
            if info is not None:
                self._returncode = _decode(info)
        return self._returncode

    @property
    def pins_group(self) -> bool:
        """True while the unreaped leader keeps its pgid from being recycled."""
        self.poll()
        return not (self.reaped or self.lost)

    def reap(self) -> int | None:
        """Reap the leader if it has exited; its exit status, or None if it still runs."""
        if self.reaped:
            return self._returncode
        if self.poll() is None:
            return None
        # Popen.poll() reaps and records the status, so Popen never warns about it later.
        self.popen.poll()
        self.reaped = True
        logger.debug("pid %d reaped, exit status %s", self.pid, self._returncode)
        return self._returncode
