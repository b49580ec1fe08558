"""Module locks that a forked child gets anew.

Only the forking thread goes on in the child: a lock another thread of the parent held
as it forked (starting the watchdog, proving a direct start, sweeping stale cgroups) would
stay held there for ever, and the child's first tree would hang on it.
"""

from __future__ import annotations

import os
import threading
from typing import Any


def renewed_in_forked_child(namespace: dict[str, Any], *names: str) -> None:
    """Have a forked child bind each of ``names`` in ``namespace`` (a module's globals) to
    a new, free lock."""

    def renew() -> None:
        for name in names:
            namespace[name] = threading.Lock()

    if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
        os.register_at_fork(after_in_child=renew)
