"""``trio-proctree orphans``: processes that outlived the program that started them.

A process whose parent dies is adopted by init (PID 1 of its PID namespace: the container
init, in a container) or by the nearest child subreaper above it (``systemd --user``, a
test runner, trio_proctree itself in its subreaper mode). A periodic look at what was
adopted is how escaping trees show up before they exhaust memory, ports or pids.

Listed: every child of PID 1 and of each ``--reaper`` named; and the children of this
command's ancestors (any of which may be a subreaper) that sit in a process group or
session their parent is not in, whose leader has exited: they plainly outlived what
started them. A child in its parent's own group and session is an ordinary child, even
when that group's leader is gone (as for anything run from a CI job or ``setsid cmd &``).
Which process is a subreaper cannot be read from outside, so an adopted ``setsid``
escapee (its own session leader) shows up only under PID 1 or a ``--reaper``. Services
PID 1 started itself are listed too: narrow the list with ``--match``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

import attrs

from ._orphans import children
from ._procfs import ProcStat, command_line, is_alive, on_one_line, read_file, read_stat
from ._said import say, say_on_stderr


@attrs.frozen
class Orphan:
    pid: int
    ppid: int
    age: float  # seconds since it started
    command: str


def _ancestors(pid: int) -> list[int]:
    found: list[int] = []
    while (stat := read_stat(pid)) is not None and stat.ppid > 1:
        pid = stat.ppid
        found.append(pid)
    return found


def _outlived_its_starter(stat: ProcStat, parent: ProcStat) -> bool:
    """Whether it sits in a process group or session that its parent is not in, and whose
    leader has exited: the process that started it is gone."""
    return any(
        leader not in (stat.pid, parents) and not is_alive(leader)
        for leader, parents in ((stat.pgid, parent.pgid), (stat.sid, parent.sid))
    )


def find_orphans(
    pattern: re.Pattern[str] | None = None, reapers: Sequence[int] = ()
) -> list[Orphan]:
    me = os.getpid()
    ancestors = _ancestors(me)
    adopters = {1, *reapers}
    now = float(read_file("/proc/uptime").split()[0])
    ticks = os.sysconf("SC_CLK_TCK")
    found: list[Orphan] = []
    for reaper in dict.fromkeys([1, *reapers, *ancestors]):
        if (parent := read_stat(reaper)) is None:
            continue
        for pid in children(reaper):
            stat = read_stat(pid)
            if stat is None or not stat.alive or pid == me or pid in ancestors:
                continue
            if reaper not in adopters and not _outlived_its_starter(stat, parent):
                continue  # an ordinary child of one of our ancestors (a shell's job, say)
            command = command_line(pid)
            if pattern is not None and not pattern.search(command):
                continue
            found.append(Orphan(pid, reaper, max(0.0, now - stat.starttime / ticks), command))
    return sorted(found, key=lambda orphan: orphan.pid)


def report(orphans: list[Orphan], *, as_json: bool) -> str:
    if as_json:
        rows: list[dict[str, Any]] = [attrs.asdict(orphan) for orphan in orphans]
        return json.dumps(rows, indent=2) + "\n"
    if not orphans:
        return "no orphans\n"
    lines = [f"{'PID':>7} {'PARENT':>7} {'AGE':>9}  COMMAND"]
    lines.extend(
        f"{o.pid:>7} {o.ppid:>7} {_age(o.age):>9}  {on_one_line(o.command)}" for o in orphans
    )
    return "\n".join(lines) + "\n"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def run(match: str | None, as_json: bool, reapers: Sequence[int] = ()) -> int:
    """Print the orphans; exit status 1 if there are any (a monitoring check), else 0;
    2 if a reaper named does not exist (its children could not be looked at: a check with a
    wrong pid must not say all is well)."""
    if missing := [pid for pid in reapers if read_stat(pid) is None]:
        say_on_stderr(f"trio-proctree orphans: no process {missing[0]} to list children of\n")
        return 2
    pattern = re.compile(match) if match is not None else None
    orphans = find_orphans(pattern, reapers)
    say(report(orphans, as_json=as_json))
    return 1 if orphans else 0
