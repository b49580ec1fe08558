"""Picking a tree's containment ("auto", "cgroup", "subreaper", "group") and starting the
tree inside it. Shared by the trio and asyncio drivers."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from . import _watchdog as watchdog
from ._cgroup import CgroupContainment
from ._cgroup_home import CgroupHome, CgroupUnavailable, cgroup_home
from ._containment import Containment
from ._group import ProcessGroupContainment
from ._orphans import SubreaperUnavailable, check_subreaper_available
from ._procfs import foreign_proc
from ._spawn import Spawned, SpawnPlan, StartedUnwatched, spawn
from ._subreaper import SubreaperContainment

logger = logging.getLogger("trio_proctree")

CONTAINMENTS = ("auto", "cgroup", "subreaper", "group")


class ContainmentUnavailable(RuntimeError):
    """The containment asked for cannot be used on this machine (the message says why);
    raised for every one, even "auto", under a /proc of another pid namespace."""


@attrs.frozen
class ContainmentChoice:
    """The containment picked for new trees: its name, and how to make one."""

    name: str
    make: Callable[[], Containment]
    #: What "auto" takes for a tree whose cgroup cannot be made after all (a cgroup limit
    #: reached since the choice); None: the containment was asked for by name.
    otherwise: Callable[[], ContainmentChoice] | None = None


def choose_containment(mode: str, *, changes_user: bool = False) -> ContainmentChoice:
    """How trees will be contained; checked before anything is spawned.

    ``"auto"`` takes the strongest available: a cgroup of its own where a writable cgroup
    v2 hierarchy is delegated to us, else this process as child subreaper (process-wide;
    made so when the first such tree starts), else the process group alone. A leader that
    runs as another user (``user=``; or, unless it stays root, another ``group=`` or
    ``extra_groups=``) cannot join a cgroup we own.

    Raises:
        ValueError: ``mode`` names no containment.
        ContainmentUnavailable: ``mode`` is not available here (none is, under a /proc
            of another pid namespace).
    """
    if mode not in CONTAINMENTS:
        raise ValueError(
            f"containment must be one of {', '.join(map(repr, CONTAINMENTS))}, not {mode!r}"
        )
    if (foreign := foreign_proc()) is not None:
        # Every containment reads /proc (the leader's start time, a tree's members): one
        # that names other processes would have them signalled, and ours missed.
        raise ContainmentUnavailable(f"no containment can be trusted here: {foreign}")
    if mode in ("auto", "cgroup"):
        try:
            home = _cgroup_home_for(changes_user=changes_user)
        except CgroupUnavailable as exc:
            if mode == "cgroup":
                raise ContainmentUnavailable(f"cgroup containment is unavailable: {exc}") from None
            logger.debug("cgroup containment unavailable (%s)", exc)
        else:
            otherwise = (lambda: _beyond_cgroups("auto")) if mode == "auto" else None
            return ContainmentChoice("cgroup", lambda: CgroupContainment(home), otherwise)
    return _beyond_cgroups(mode)


def _beyond_cgroups(mode: str) -> ContainmentChoice:
    """The choice among the containments that need no cgroup."""
    if mode in ("auto", "subreaper"):
        try:
            check_subreaper_available()
        except SubreaperUnavailable as exc:
            if mode == "subreaper":
                raise ContainmentUnavailable(
                    f"subreaper containment is unavailable: {exc}"
                ) from None
            logger.debug("subreaper containment unavailable (%s); using the process group", exc)
        else:
            return ContainmentChoice("subreaper", SubreaperContainment)
    return ContainmentChoice("group", ProcessGroupContainment)


def _cgroup_home_for(*, changes_user: bool) -> CgroupHome:
    if changes_user:
        raise CgroupUnavailable(
            "the command runs as another user or group (user=, group=, extra_groups=), "
            "which cannot join a cgroup owned by this process"
        )
    return cgroup_home()


def start_tree(plan: SpawnPlan, choice: ContainmentChoice) -> tuple[Spawned, Containment]:
    """Start the leader inside a new containment (blocking: drivers run it in a thread)."""
    watchdog.ensure_started()
    try:
        containment = choice.make()
    except CgroupUnavailable as exc:
        # The hierarchy was there when the containment was chosen, but this tree's cgroup
        # cannot be made: a cgroup limit is reached, say, which frees up as trees end.
        if choice.otherwise is None:
            raise ContainmentUnavailable(f"cgroup containment is unavailable: {exc}") from exc
        instead = choice.otherwise()
        _log_cgroup_passed_over(exc, instead.name)
        containment = instead.make()
    try:
        spawned = spawn(containment.prepare(plan))
    except StartedUnwatched as started:
        # Its leader ran, and may have started others: not known to be empty, what of
        # the tree its containment can tell is killed now (else it would run on unseen).
        containment.release(emptied=False)
        raise started.error from None
    except BaseException:
        containment.release()
        raise
    containment.started(spawned)
    return spawned, containment


#: Whether "auto" has passed over cgroups for a tree in this process (then said once at
#: WARNING: the trees it starts so are contained less well; later ones at DEBUG).
_passed_over = False


def _log_cgroup_passed_over(why: CgroupUnavailable, instead: str) -> None:
    global _passed_over  # noqa: PLW0603 - one notice per process
    level = logging.DEBUG if _passed_over else logging.WARNING
    _passed_over = True
    also = (
        " (this process is now the child subreaper of its descendants, for good)"
        if instead == "subreaper"
        else ""
    )
    logger.log(level, "%s; this tree is contained by %s instead%s", why, instead, also)
