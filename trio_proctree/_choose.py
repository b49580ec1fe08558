"""Picking a tree's containment ("auto", "cgroup", "subreaper", "group") and starting the
tree inside it. Shared by the trio and asyncio drivers."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from . import _watchdog as watchdog
from ._cgroup import CgroupContainment, CgroupUnavailable, cgroup_home
from ._containment import Containment, ProcessGroupContainment
from ._orphans import SubreaperUnavailable, become_subreaper
from ._spawn import Spawned, SpawnPlan, spawn
from ._subreaper import SubreaperContainment

logger = logging.getLogger("trio_proctree")

CONTAINMENTS = ("auto", "cgroup", "subreaper", "group")


class ContainmentUnavailable(RuntimeError):
    """The containment asked for cannot be used on this machine (the message says why)."""


@attrs.frozen
class ContainmentChoice:
    """The containment picked for new trees: its name, and how to make one."""

    name: str
    make: Callable[[], Containment]


def choose_containment(mode: str) -> ContainmentChoice:
    """How trees will be contained; checked before anything is spawned.

    ``"auto"`` takes the strongest available: a cgroup of its own where a writable cgroup
    v2 hierarchy is delegated to us, else this process as child subreaper (process-wide),
    else the process group alone.

    Raises:
        ValueError: ``mode`` names no containment.
        ContainmentUnavailable: ``mode`` is not available here.
    """
    if mode not in CONTAINMENTS:
        raise ValueError(
            f"containment must be one of {', '.join(map(repr, CONTAINMENTS))}, not {mode!r}"
        )
    if mode in ("auto", "cgroup"):
        try:
            home = cgroup_home()
        except CgroupUnavailable as exc:
            if mode == "cgroup":
                raise ContainmentUnavailable(f"cgroup containment is unavailable: {exc}") from None
            logger.debug("cgroup containment unavailable (%s)", exc)
        else:
            return ContainmentChoice("cgroup", lambda: CgroupContainment(home))
    if mode in ("auto", "subreaper"):
        try:
            become_subreaper()
        except SubreaperUnavailable as exc:
            if mode == "subreaper":
                raise ContainmentUnavailable(
                    f"subreaper containment is unavailable: {exc}"
                ) from None
            logger.debug("subreaper containment unavailable (%s); using the process group", exc)
        else:
            return ContainmentChoice("subreaper", SubreaperContainment)
    return ContainmentChoice("group", ProcessGroupContainment)


def start_tree(plan: SpawnPlan, choice: ContainmentChoice) -> tuple[Spawned, Containment]:
    """Start the leader inside a new containment (blocking: drivers run it in a thread)."""
    watchdog.ensure_started()
    containment = choice.make()
    try:
        return spawn(containment.prepare(plan)), containment
    except BaseException:
        containment.release()
        raise
