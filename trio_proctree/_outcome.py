"""What cleanup did to a tree, and the error it raises when it could not finish the job."""

from __future__ import annotations

import logging
import sys
from typing import cast

import attrs

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # trio's own dependency on 3.10

logger = logging.getLogger("trio_proctree")


@attrs.frozen
class CleanupOutcome:
    """A record of one tree's cleanup, available as ``tree.outcome`` once cleanup ran."""

    #: How the tree was held together, ``"cgroup"``, ``"subreaper"`` or ``"group"``.
    containment: str
    #: Signals cleanup sent to the whole tree, in order (each stop signal is followed by
    #: SIGCONT), a `Step` with ``leader_only`` to the leader alone, while it ran (its
    #: SIGCONT to every process); such a step handed on to what the leader left shows
    #: twice.
    #: Empty when nothing was left running, or when the program had killed the tree
    #: (``kill()``) and it ended within the wait that follows (no stop signal then).
    signals: tuple[int, ...]
    #: Whether the close-stdin step ran first and the tree's stdin was closed (then, or
    #: already; not where the program took the stream off the tree and holds it open).
    stdin_closed: bool
    #: Whether the graceful steps ran out of time, so SIGKILL was needed. False when a
    #: Ctrl-C during cleanup cut them short (SIGKILL then came at once: see ``signals``).
    grace_expired: bool
    #: Processes other than the leader that outlived it and were stopped by cleanup. They
    #: were still running when cleanup began after the leader had exited (``sh -c "sleep
    #: 60 & exit 0"`` leaves one), or at a later step (a member that ignored the stop
    #: signal that ended the leader, say, or one a leader-only step was handed on to once
    #: the leader had left it running). Members that stop with the leader on the same
    #: signal from cleanup do not count; after a signal the program sent itself
    #: (``send_signal``), those still exiting when cleanup begins may. After the program's
    #: ``kill()``, only those still running at cleanup's hard stop count (the rest were
    #: dying of it, or were found later and given its SIGKILL then).
    lingering_killed: int
    #: Members outside the tree's process group (``setsid`` daemons, double forks) that
    #: were found and stopped, by cleanup or by a signal the program sent through the tree
    #: (``kill()``); a process group alone cannot see them. When the leader
    #: was reaped by someone else, the group is unknown and every member found counts.
    #: An escapee that outlived the leader is counted in ``lingering_killed`` too: the
    #: two overlap, and their sum can count a process twice.
    escapees_killed: int
    #: Seconds from the start of cleanup until the leader was reaped.
    duration: float
    #: The leader's exit status (minus the signal number if a signal ended it); None if
    #: cleanup could not reap it: other code reaped it first, before its exit was seen
    #: (its status is then lost to the tree: see the FAQ), or it outlived SIGKILL.
    returncode: int | None
    #: Whether cleanup saw every process of the tree gone. False where it raised
    #: `CleanupError` (processes outlived SIGKILL, or the tree could not be looked at):
    #: raised to one call (the first to wait for the cleanup); another ``aclose()``
    #: raises nothing of it, and can tell from here that the tree may not be gone. (True by
    #: default, for code that makes outcomes of its own, as before this field.)
    emptied: bool = True


class CleanupError(RuntimeError):
    """Cleanup could not make sure the tree is gone (e.g. processes outlived SIGKILL)."""


def _cut_links_back_to(exc: BaseException, error: BaseException) -> None:
    """Cut every link of ``error``'s chain that leads to ``exc``, about to be its cause.

    A cleanup error raised while ``exc`` was being handled (trio's cleanup runs in the
    block's ``__aexit__``) has ``exc`` as its context, and made ``exc``'s cause, the chain
    would loop. Python's own traceback printing cuts such a loop, but a renderer that walks
    the chain without remembering what it saw (rich's tracebacks) follows it for ever:
    a program that logged with it hung in the log call below, its memory growing. Nothing
    is lost by the cut: the link pointed at the exception the error is attached to.
    """
    seen: set[int] = set()
    pending = [error]
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        if link.__cause__ is exc:
            set_cause(link, None)
        if link.__context__ is exc:
            set_context(link, None)
        pending += [nxt for nxt in (link.__cause__, link.__context__) if nxt is not None]
        if isinstance(link, BaseExceptionGroup):  # (its members' chains are shown too)
            group = cast("BaseExceptionGroup[BaseException]", link)
            pending += group.exceptions


# The user's exception may refuse attribute writes: a frozen dataclass raises
# FrozenInstanceError from ``exc.__cause__ = ...`` and from ``add_note`` (which sets
# ``__notes__`` through the class's ``__setattr__``; attrs lets an exception's own
# through). Raised in cleanup, that error replaced the user's exception (helper-96).
# Links are set through BaseException's own descriptors, which no subclass's
# ``__setattr__`` stands in front of.
_CAUSE = BaseException.__dict__["__cause__"]
_CONTEXT = BaseException.__dict__["__context__"]


def set_cause(exc: BaseException, cause: BaseException | None) -> None:
    """``exc.__cause__ = cause`` (which also sets ``__suppress_context__``), whatever
    ``exc``'s class does with attribute writes."""
    _CAUSE.__set__(exc, cause)


def set_context(exc: BaseException, context: BaseException | None) -> None:
    """``exc.__context__ = context``, whatever ``exc``'s class does with attribute writes."""
    _CONTEXT.__set__(exc, context)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (PEP 678), by hand on every version: past the class's
    ``__setattr__``, and on Python 3.10, whose tracebacks show notes once exceptiongroup,
    a dependency of trio there, is imported. Where ``exc`` cannot take
    it (``__notes__`` no list, or its class's own code raises), the log alone says it:
    nothing of the user's is rewritten, and nothing raised in its place."""
    try:
        notes: object = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            cast("list[str]", notes).append(note)  # (as add_note does: no attribute write)
        elif notes is None:
            # Past the class's __setattr__, as dataclasses' own __init__ sets frozen fields.
            object.__setattr__(exc, "__notes__", [note])
    except Exception:  # noqa: BLE001 - the class's own code: the log says the error
        pass


def chain_cleanup_error(exc: BaseException, error: BaseException, label: str) -> None:
    """Attach a cleanup ``error`` to the ``exc`` already propagating, without replacing it.

    The cleanup error becomes ``exc.__cause__`` when that is free (as the asyncio contract
    asks) and a note otherwise; it is also logged, since a cancellation that a cancel scope
    absorbs would take its ``__cause__`` with it. Free: no cause, and no context that the
    traceback shows (an exception raised while another was handled): a traceback shows a
    cause in place of the context, and the user's first error would vanish from it.
    """
    if exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__):
        _cut_links_back_to(exc, error)
        set_cause(exc, error)
    else:
        _add_note(exc, f"cleanup of {label} also failed: {error!r}")
    logger.error(
        "cleanup of %s failed while %s was propagating",
        label,
        type(exc).__name__,
        exc_info=error,
    )
