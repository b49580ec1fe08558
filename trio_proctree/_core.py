"""One tree's state and its cleanup, written once for both drivers.

`TreeCore` holds what a running tree is (leader, containment, policy) and runs the
escalation against it. The few things that need an event loop (waiting for a file
descriptor, yielding, closing the driver's streams) come from the driver as a small
`LoopIO` object; everything else here is plain code, so the trio and asyncio drivers
share one cleanup.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import select
import signal
import threading
import time
from typing import Protocol

from ._cgroup_home import remove_home
from ._containment import (
    NEED_SCAN,
    RETRY_PAUSE,
    UNSEEN,
    Containment,
    ContainmentLost,
    Pending,
)
from ._escalation import Escalation, SignalLike, parse_signal, signal_name
from ._leader import Leader
from ._outcome import CleanupError, CleanupOutcome, chain_cleanup_error
from ._procfs import catches
from ._spawn import Spawned, SpawnPlan
from ._teardown import (
    Action,
    Answer,
    AwaitEmpty,
    CloseStdin,
    CutShort,
    Finished,
    KillAll,
    LeaderExited,
    LeaderLeft,
    LeaderStep,
    SendSignal,
    Teardown,
    Unseen,
)

logger = logging.getLogger("trio_proctree")

#: Every tree not yet cleaned up, for the net at interpreter exit (`kill_open_trees`):
#: strong references, so that a tree whose owner was garbage-collected is not forgotten.
_open_trees: set[TreeCore] = set()


class LoopIO(Protocol):
    """What cleanup needs from the driver's event loop."""

    def now(self) -> float:
        """The loop's clock, in seconds."""
        ...

    async def wait_readable(self, fd: int, timeout: float) -> None:
        """Return when ``fd`` is readable or ``timeout`` seconds have passed."""
        ...

    async def yield_now(self) -> None:
        """Let every other runnable task run once (never raises a cancellation)."""
        ...

    def interrupted(self) -> bool:
        """Whether the program was interrupted (Ctrl-C) during this cleanup: graces are then
        cut short, and the interrupt is raised once the tree is gone."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Pause (never raises a cancellation)."""
        ...

    async def close_stdin(self, within: float) -> Exception | None:
        """Close the tree's stdin pipe, if the driver still holds it; the error, if any.

        A stream the program put in its place is given ``within`` seconds to close.
        """
        ...

    def stdin_kept_open(self) -> bool:
        """Whether the program took the tree's stdin pipe off the tree (cleanup leaves such
        a stream open) and holds it open still: cleanup's own close gave the tree no EOF."""
        ...

    async def close_streams(self, within: float) -> list[Exception]:
        """Close every pipe the driver still holds; the errors, if any.

        Streams the program put in their place are given ``within`` seconds to close.
        """
        ...

    def forget_fd(self, fd: int) -> None:
        """``fd`` is about to be closed: wake anything in the loop still waiting on it."""
        ...

    def keep_output_flowing(self) -> None:
        """From now until `close_streams`, read the tree's output pipes that nobody reads
        (into their streams, up to a bound): a program that writes as it stops must not
        block on a full pipe, unable to act on the step, until SIGKILL."""
        ...


#: Seconds after a graceful step before cleanup reads the output pipes that nobody reads:
#: a tree that stops at once (most do, within a millisecond) never pays for the reader
#: (a task, under trio: a seventh of a cooperative teardown, measured), and one blocked
#: writing to a full pipe loses a hundredth of a second.
OUTPUT_FLOWS_AFTER = 0.01


class TreeCore:
    """A running tree: its leader, its containment, its stop policy, and its cleanup."""

    def __init__(
        self, spawned: Spawned, containment: Containment, plan: SpawnPlan, policy: Escalation
    ) -> None:
        self.args = plan.args
        self.leader = Leader(
            spawned.pid,
            spawned.popen,
            spawned.pidfd,
            spawned.started_within,
            spawned.parent_thread,
            lost=spawned.lost,
            heads_session=bool(plan.options.get("start_new_session")),
        )
        self.containment = containment
        #: Held around each use of the containment and of the leader's pidfd. The net at
        #: interpreter exit (main thread) and a daemon thread's loop, running on during
        #: atexit, may stop one tree at once: one closed a pidfd the other was about to
        #: signal or reap through, and its number, reused since, could name a process of
        #: another tree (helper-94). Re-entrant: a signal handler that forwards its signal
        #: to the tree may run while its own thread holds the lock.
        self.lock = threading.RLock()
        containment.attach(self.leader)
        self.policy = policy
        self.label = f"pid {self.leader.pid} ({plan.label})"
        #: What cleanup did, kept as it ran out, until `outcome` first reads it.
        self._record: tuple[Teardown, int, int, float, int | None, bool, bool] | None = None
        self._outcome: CleanupOutcome | None = None
        self._cleaned_up = False
        #: The containment was let go (`_release`).
        self._released = False
        #: The program held the tree's stdin open, off the tree, as the close-stdin step's
        #: wait ended.
        self._stdin_held_open = False
        #: Whether the program's SIGKILL went to the whole tree (`ProcessTree.kill`).
        self._killed = False
        #: Whether the last look at who is left failed (`_pending`): a wait that runs out
        #: then has not seen the tree run on, and must not say it did.
        self._look_failed = False
        #: When cleanup is to read the tree's output pipes (`_until_output_flows`): None
        #: until a graceful step asks for it, infinity once it does.
        self._output_flows_at: float | None = None
        self.stdin_piped = spawned.stdin is not None
        #: The process that started the tree: the one to stop it (`forked_away`).
        self.owner = os.getpid()
        _open_trees.add(self)
        logger.debug("%s started, contained by %s", self.label, containment.name)

    @property
    def forked_away(self) -> bool:
        """Whether this is a child forked from the process that started the tree. The tree
        is that process's to stop: a child that forked inside the block and leaves it (its
        exec failed, say) ran the cleanup there, and stopped the parent's tree under it,
        through the inherited pidfd or cgroup (helper-101). The drivers leave it alone."""
        if os.getpid() == self.owner:
            return False
        logger.debug(
            "%s: left alone by pid %d, a child forked from its owner", self.label, os.getpid()
        )
        return True

    def send_signal(self, sig: SignalLike) -> None:
        sig = parse_signal(sig)
        if self.forked_away:
            # A forked child's copy cannot know whether the tree still runs: its parent may
            # have stopped it, and the cgroup be the next tree's (helper-102: the child's
            # kill() ended that one). Asked before the lock, which a thread of the parent's
            # may have held as it forked.
            return
        with self.lock:
            if self.leader.reaped or self._cleaned_up:
                # Once cleanup has run, nothing of the tree is left to signal, and what
                # named it may name another by now: the group id once the leader is reaped,
                # the cgroup once the next tree has it. (The leader's pidfd is closed, too.)
                return
            self.containment.signal(sig)
            self._killed |= sig == signal.SIGKILL  # (only once it went out: it raised else)

    async def cleanup(self, io: LoopIO) -> None:
        """Stop the tree as the policy says, reap the leader, record `outcome`.

        Never cut short by a cancellation: the driver shields each of its waits
        (`LoopIO`). Raises the first error (the rest are logged): a failed step does not
        stop the escalation, as the next may still work, and neither does a failure to see
        who is left (file descriptors running out, say): then cleanup looks again in short
        pauses, until the policy's time is up.
        """
        started = time.monotonic()
        # The close-stdin step runs for any tree whose stdin was made a pipe: closed
        # already (by the program, or by run_process_tree once it fed the input), it
        # still gives a CLI finishing that input its wait before the first signal.
        teardown = Teardown(
            self.policy, label=self.label, stdin_open=self.stdin_piped, killed=self._killed
        )
        errors: list[Exception] = []
        action: object = None
        hard_stop_failed = False  # (it failed, at least in part: said, not only outlived)
        interrupt: KeyboardInterrupt | None = None
        try:
            # A running leader is a running tree, and one call tells: the first step then
            # goes out before the containment is asked anything (on a VM, each call that
            # has not run lately costs tens of us, added to the tree's time to stop).
            self._poll_leader()  # (asks the kernel; `exited` reads the answer)
            alive = not self.leader.exited or await self._pending(io, errors) != []
            action = teardown.start(tree_alive=alive)
            action, hard_stop_failed = await self._drive(io, teardown, action, errors)
        except KeyboardInterrupt as exc:
            # asyncio raises a Ctrl-C wherever Python runs, in this cleanup's steps too
            # (trio holds it back: `_run_cleanup`). Left to go on, it ended the cleanup
            # half done (and the escalation machine, if it landed in a log call of the
            # machine's): the tree ran on until interpreter exit. Held instead: the hard
            # stop now, as a Ctrl-C during a grace gives, and raised once it is done.
            interrupt = exc
            action = teardown.interrupted()
            action, hard_stop_failed = await self._drive(io, teardown, action, errors)
        finally:
            emptied = isinstance(action, Finished) and action.emptied
            # Only now that the tree is empty (or beyond help) do our pipe ends go: closing
            # them first would kill writers with SIGPIPE instead of letting them stop.
            await self._close_streams(io, started, errors)
            try:
                # Before the leader is reaped: its zombie still pins the group id while the
                # tree's orphans are recognised by it. A tree not known to be empty keeps
                # its parent-death backstop armed.
                self._release(emptied)
            except Exception as exc:  # noqa: BLE001 - even a bug there must not skip the reap
                errors.append(exc)
            with self.lock:
                self._cleaned_up = True
                returncode = self._reap_leader(io)
            self._record = self._record_and_log(
                teardown,
                time.monotonic() - started,
                returncode,
                self._stdin_closed(teardown),
                emptied,
            )
        if isinstance(action, Finished) and not action.emptied:
            errors.insert(
                0, self._outlived(errors, hard_stop_failed=hard_stop_failed, unseen=action.unseen)
            )
        self._raise_what_failed(interrupt, errors)

    def _stdin_closed(self, teardown: Teardown) -> bool:
        """Whether the close-stdin step ran and the tree's stdin was closed: not where the
        program took the stream off the tree and held it open through the step's wait
        (cleanup leaves such a stream open; it said so all the same: helper-55)."""
        if teardown.stdin_closed and self._stdin_held_open:
            logger.debug(
                "%s: stdin was taken off the tree and held open: the close-stdin step "
                "could not close it",
                self.label,
            )
            return False
        return teardown.stdin_closed

    def _reap_leader(self, io: LoopIO | None) -> int | None:
        """Reap the leader (after the last group signal, never before), and close its
        pidfd once it is reaped; its exit status, if seen. (``io``: the loop that may
        watch the pidfd, told it goes; None, with no loop.)"""
        returncode = self.leader.reap()
        if (returncode is not None or self.leader.lost) and self.leader.pidfd >= 0:
            if io is not None:
                io.forget_fd(self.leader.pidfd)
            # Never to be used again: -1 before the close, for a thread that reads it
            # meanwhile (the net at interpreter exit may), not a number reused since.
            pidfd, self.leader.pidfd = self.leader.pidfd, -1
            os.close(pidfd)
        return returncode

    def kill_blocking(self, *, when: str) -> None:
        """Where no cleanup can run (no event loop; ``when`` says where, for the log):
        SIGKILL the tree, reap its leader and wait for the rest to go, each within
        ``kill_wait``, and let its containment go (its backstop kept armed unless the tree
        was seen empty). Blocking; what fails is logged (there is no caller to tell)."""
        deadline = time.monotonic() + self.policy.kill_wait
        kill_at_once([self], when=when)
        emptied = False
        try:
            while (pending := self._pending_now()) != []:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if isinstance(pending, list):  # a member's pidfd turns readable as it exits
                    poller = select.poll()
                    poller.register(pending[0], select.POLLIN)
                    poller.poll(min(left, self.containment.ask_again_within or left) * 1000)
                else:
                    time.sleep(min(left, self._pause_for(pending)))
            else:
                emptied = True
            self._release(emptied)
        except Exception:  # (nobody to raise it to: said, as the net says its failures)
            logger.exception("%s: could not let the tree go %s", self.label, when)
        finally:
            with self.lock:
                self._cleaned_up = True
                self._reap_leader(None)

    def _pending_now(self) -> Pending:
        """`Containment.pending`, asked under the tree's lock."""
        with self.lock:
            return self.containment.pending()

    def _release(self, emptied: bool) -> None:
        """Let the containment go, once (a cleanup finalised after `kill_blocking` did)."""
        with self.lock:
            if not self._released:
                self._released = True
                self.containment.release(emptied=emptied)
            if emptied:
                # Else the net at interpreter exit keeps it (as it does one whose release
                # raised: a Ctrl-C there left its leader unreaped, helper-98). Gone from
                # the set within the lock that let it go: an emptied cgroup is the next
                # tree's from then on, and a net that had listed this tree, then waited
                # for the lock, must find it gone, not kill that other tree (helper-97).
                _open_trees.discard(self)

    def _raise_what_failed(
        self, interrupt: KeyboardInterrupt | None, errors: list[Exception]
    ) -> None:
        """Raise a Ctrl-C held during cleanup, carrying its errors (it wins, as over the
        user's own exception); else the first error, the rest logged."""
        if interrupt is not None:
            for error in errors:
                chain_cleanup_error(interrupt, error, self.label)
            raise interrupt
        if errors:
            for extra in errors[1:]:
                logger.error("%s: another cleanup error", self.label, exc_info=extra)
            raise errors[0]

    async def _drive(
        self, io: LoopIO, teardown: Teardown, action: Action, errors: list[Exception]
    ) -> tuple[Finished, bool]:
        """Perform ``action`` and each the escalation asks for next, until it is finished;
        how it finished, and whether its hard stop failed (at least in part)."""
        hard_stop_failed = False
        # What an action leaves to the wait after it: when stdin was closed (the wait
        # counts from there), and a step that went to the leader alone (the wait then
        # tells of the leader's leaving without passing it on: `LeaderLeft`).
        closed_stdin_at, leader_step = None, None
        while not isinstance(action, Finished):
            emptied: Answer = None
            if isinstance(action, AwaitEmpty):
                emptied = await self._wait_empty(
                    io, action, errors, since=closed_stdin_at, leader_step=leader_step
                )
                if closed_stdin_at is not None:
                    # Asked as the step's wait ends, not as it begins: a task of the
                    # program's that feeds the tree may close it meanwhile (helper-57).
                    self._stdin_held_open = io.stdin_kept_open()
                closed_stdin_at, leader_step = None, None
            elif isinstance(action, CloseStdin):
                self._let_output_flow(io)  # (a CLI writes its result on EOF)
                # The wait that follows counts from here: a stream the program put in
                # place of stdin, slow to close, spends it (never more than it).
                closed_stdin_at = io.now()
                within = self.policy.close_stdin or 0.0
                if (error := await io.close_stdin(within)) is not None:
                    errors.append(error)
            elif isinstance(action, SendSignal):
                self._let_output_flow(io)  # (a program writes its last words as it stops)
                leader_step = self._step(errors, action.signal, leader_only=action.leader_only)
            elif isinstance(action, KillAll):  # pragma: no branch
                hard_stop_failed = not self._hard_stop(errors)
                # The machine's answer: False for a hard stop that did not go out.
                emptied = False if hard_stop_failed else None
            action = teardown.send(emptied)
        return action, hard_stop_failed

    def _outlived(
        self, errors: list[Exception], *, hard_stop_failed: bool, unseen: bool
    ) -> CleanupError:
        """The error for a tree that outlived cleanup, or was not seen gone after it (it
        could not be looked at: ``unseen``), and why, as far as it is known (the first of
        ``errors``, taken off the list)."""
        verb = "may have outlived" if unseen else "outlived"
        what = "cleanup: the hard stop (SIGKILL) failed, at least in part"
        if not hard_stop_failed:
            what = "SIGKILL"
        why = " (the tree could not be looked at)" if unseen else ""
        outlived = CleanupError(f"{self.label}: processes {verb} {what}{why}")
        # Often because a step failed (no file descriptors left to list the tree, say):
        # that is the reason, and must show; shown there, it is not logged as another.
        outlived.__cause__ = errors.pop(0) if errors else None
        return outlived

    async def _close_streams(self, io: LoopIO, started: float, errors: list[Exception]) -> None:
        """The driver's pipes closed, its errors kept. A stream the program put in place
        of a pipe gets what is left of the bound the docs promise (`worst_case`), not all
        the time its aclose() would take."""
        left = started + self.policy.worst_case - time.monotonic()
        try:
            errors.extend(await io.close_streams(max(left, 0.0)))
        except Exception as exc:  # noqa: BLE001 - even a bug there must not skip the reap
            errors.append(exc)

    def _record_and_log(
        self,
        teardown: Teardown,
        duration: float,
        returncode: int | None,
        stdin_closed: bool,
        emptied: bool,
    ) -> tuple[Teardown, int, int, float, int | None, bool, bool]:
        """What `outcome` is made of, and the line that ends each cleanup. Escapees
        (members outside the tree's process group) are what a group alone would have left
        running: worth INFO."""
        lingering, escapees = self.containment.lingering, self.containment.escapees
        level = logging.INFO if escapees else logging.DEBUG
        if logger.isEnabledFor(level):  # (building the message costs, on this path)
            logger.log(
                level,
                "%s: cleanup done in %.1f ms by %s containment: %d lingering and %d "
                "escaped process(es) stopped",
                self.label,
                duration * 1000,
                self.containment.name,
                lingering,
                escapees,
            )
        return teardown, lingering, escapees, duration, returncode, stdin_closed, emptied

    @property
    def outcome(self) -> CleanupOutcome | None:
        """What cleanup did; None until it ran. Made when first read, not on the path that
        ends the tree (where its ~20 us counted)."""
        if self._outcome is None and self._record is not None:
            teardown, lingering, escapees, duration, returncode, stdin_closed, emptied = (
                self._record
            )
            self._outcome = CleanupOutcome(
                containment=self.containment.name,
                signals=tuple(teardown.signals),
                stdin_closed=stdin_closed,
                grace_expired=teardown.grace_expired,
                lingering_killed=lingering,
                escapees_killed=escapees,
                duration=duration,
                returncode=returncode,
                emptied=emptied,
            )
            self._record = None  # (nor the escalation kept alive for it)
        return self._outcome

    def _hard_stop(self, errors: list[Exception]) -> bool:
        """SIGKILL to the whole tree; whether it went out (else its error is kept)."""
        try:
            with self.lock:
                self.containment.kill()
        except Exception as exc:  # noqa: BLE001 - even a bug here must not stop the escalation
            errors.append(exc)
            return False
        return True

    def _step(
        self, errors: list[Exception], sig: int, *, leader_only: bool = False
    ) -> LeaderStep | None:
        """Send ``sig``, a step of the escalation; if it went to the leader alone, what
        the wait after it needs to know of that."""
        try:
            with self.lock:
                return self._step_locked(sig, leader_only=leader_only)
        except Exception as exc:  # noqa: BLE001 - even a bug here must not stop the escalation
            errors.append(exc)
        return None

    def _step_locked(self, sig: int, *, leader_only: bool) -> LeaderStep | None:
        if leader_only:
            # Asked before the signal: a leader that re-raises it, its work done, sets it
            # back to the default action first. (Never an error: a look that fails must
            # not keep the step from going; unknown reads as no handler.)
            caught = catches(self.leader.pid, sig)  # (its unreaped zombie pins the pid)
            if self.containment.signal(sig, escalation=True, leader_only=True):
                return LeaderStep(sig, caught)
            # The machine said "to the leader"; the log must not leave it at that.
            logger.debug(
                "%s: the leader had exited: %s to every process instead",
                self.label,
                signal_name(sig),
            )
        else:
            self.containment.signal(sig, escalation=True)
        return None

    async def _pending(self, io: LoopIO, errors: list[Exception]) -> list[int] | float:
        """The pidfds of the tree's live members, or, when that cannot be told right now,
        how long to pause before asking again."""
        try:
            pending = self._pending_now()
            if pending is NEED_SCAN:
                # Let the other teardowns woken with this one reach this point too, so that
                # one /proc scan serves them all (or let a member finish exiting).
                await io.yield_now()
                pending = self._pending_now()
        except Exception as exc:  # noqa: BLE001 - reported at the end; the escalation goes on
            if not any(type(exc) is type(seen) and exc.args == seen.args for seen in errors):
                errors.append(exc)
            self._look_failed = True
            return RETRY_PAUSE  # a degraded poll, only here: the error is raised at the end
        # (A look that failed and is held, not raised, leaves the tree unseen all the same:
        # a wait that runs out meanwhile must not say it still runs.)
        self._look_failed = pending is UNSEEN
        return pending if isinstance(pending, list) else self._pause_for(pending)

    def _pause_for(self, pending: object) -> float:
        """How long to pause before asking again a containment that could not name the
        tree's live members (`NEED_SCAN` or `RETRY_LATER`)."""
        if pending is NEED_SCAN:
            return 0.001  # a member still finishing its exit: it takes microseconds
        return self.containment.ask_again_within or RETRY_PAUSE

    async def _wait_empty(
        self,
        io: LoopIO,
        wait: AwaitEmpty,
        errors: list[Exception],
        *,
        since: float | None,
        leader_step: LeaderStep | None = None,
    ) -> bool | LeaderLeft | CutShort | Unseen | LeaderExited:
        """Wait up to ``wait.timeout`` seconds from ``since`` (else from now) for the tree
        to empty: True if it did, `CutShort` if a Ctrl-C ended a grace (`LoopIO.interrupted`)
        first, `Unseen` if the wait ran out when the tree could not be looked at, and
        `LeaderExited` if it ran out with only what the leader left running.
        ``leader_step``: the step before went to the leader alone, and if the leader leaves
        members running without having passed it on, that is said at once (the wait wakes
        for its exit: every containment waits on the leader first)."""
        deadline = (io.now() if since is None else since) + wait.timeout
        while (pending := await self._pending(io, errors)) != []:
            remaining = deadline - io.now()
            if remaining <= 0:
                if self._look_failed:
                    return Unseen()
                # (Asks the kernel; `exited` reads the answer, true too of a leader other
                # code reaped: its status is lost, not its exit, helper-100.)
                self._poll_leader()
                return LeaderExited() if self.leader.exited else False
            if wait.grace and io.interrupted():
                return CutShort(wait.timeout - remaining, unseen=self._look_failed)
            # (A pause instead of pidfds: members finishing their exit, or a look that
            # failed. Asked again after it, not handed a step they may not need.)
            if leader_step is not None and isinstance(pending, list) and self._failed(leader_step):
                return LeaderLeft(remaining)
            if isinstance(pending, list):
                # Event-driven: a pidfd turns readable when its process exits.
                within = self.containment.ask_again_within
                timeout = min(remaining, within or remaining, self._until_output_flows(io, errors))
                await io.wait_readable(pending[0], timeout)
            else:
                await io.sleep(min(remaining, pending, self._until_output_flows(io, errors)))
        return True

    def _let_output_flow(self, io: LoopIO) -> None:
        """A graceful step is taken: the tree's output pipes are to be read from
        `OUTPUT_FLOWS_AFTER` seconds on, if it still runs then (`_until_output_flows`)."""
        if self._output_flows_at is None:
            self._output_flows_at = io.now() + OUTPUT_FLOWS_AFTER

    def _until_output_flows(self, io: LoopIO, errors: list[Exception]) -> float:
        """Seconds the tree's wait may last before cleanup must read its output pipes
        (`LoopIO.keep_output_flowing`); that reading begins, once the time has come."""
        if self._output_flows_at is None:
            return math.inf
        left = self._output_flows_at - io.now()
        if left <= 0:
            self._output_flows_at = math.inf  # (once)
            try:
                io.keep_output_flowing()
            except Exception as exc:  # noqa: BLE001 - even a bug here must not stop the escalation
                errors.append(exc)
            return math.inf
        return left

    def _failed(self, step: LeaderStep) -> bool:
        """Whether the leader, which alone had ``step``, is gone having failed it (see
        `LeaderStep.failed`). Not once the program killed the tree (``kill()``): the
        leader died of that, and the rest is dying of it."""
        if self._killed:
            return False  # the program's kill() meanwhile: the whole tree is dying of it
        # (The status seen before a loss, if one was.)
        return step.failed(self._poll_leader(), lost=self.leader.lost)

    def _poll_leader(self) -> int | None:
        """`Leader.poll`, under the tree's lock (through a pidfd another thread may close)."""
        with self.lock:
            return self.leader.poll()


class TreeView:
    """What both drivers' ``ProcessTree`` read off their `TreeCore` the same way."""

    _core: TreeCore
    #: The name users know the class by (``trio_proctree.ProcessTree``), for its repr.
    _public_name: str
    #: The streams cleanup closed, by name, each once; each driver makes it. They stay on
    #: the tree, as a `trio.Process` keeps its own: an output stream still gives what the
    #: tree said as it stopped, then its end (None after the block, or while cleanup ran,
    #: reading it was an AttributeError).
    _closed_by_cleanup: dict[str, object]

    def __repr__(self) -> str:
        # As trio.Process's says it; read without reaping, like ``returncode``.
        returncode = self.returncode
        if returncode is not None:
            state = f"exited with status {returncode}"
        elif self._core.leader.lost:
            state = "exit status lost"
        else:
            state = "running"
        return f"<{self._public_name} {self._core.label}: {state}>"  # (label: pid and command)

    @property
    def args(self) -> object:
        """The command, as given."""
        return self._core.args

    @property
    def pid(self) -> int:
        """The leader's pid; also the tree's process group id."""
        return self._core.leader.pid

    @property
    def containment(self) -> str:
        """How the tree is held together, ``"cgroup"``, ``"subreaper"`` or ``"group"``."""
        return self._core.containment.name

    @property
    def returncode(self) -> int | None:
        """The leader's exit status, or None while it runs. Reading it never reaps the leader."""
        return self._core.leader.poll()

    @property
    def outcome(self) -> CleanupOutcome | None:
        """What cleanup did (a `~trio_proctree.CleanupOutcome`); None until cleanup has run."""
        return self._core.outcome

    def send_signal(self, sig: SignalLike) -> None:
        """Send ``sig`` to every process in the tree (a no-op once cleanup has run)."""
        self._core.send_signal(sig)

    def terminate(self) -> None:
        """Send SIGTERM to every process in the tree, now (cleanup still runs at the end).

        Like `trio.Process.terminate`, for the whole tree; a no-op once cleanup has run.
        """
        self._core.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL to every process in the tree, now: no grace, nothing can catch it.

        Like `trio.Process.kill`, for the whole tree. It does not wait: cleanup, at the
        end, waits for the tree to be gone and reaps the leader, with no stop signal of
        its own (what outlives that wait, within the policy's bound, gets the hard stop).
        A no-op once cleanup has run.
        """
        self._core.send_signal(signal.SIGKILL)

    def _exit_status_lost(self) -> CleanupError:
        return CleanupError(f"{self._core.label}: exit status lost (reaped elsewhere)")


def _at_exit() -> None:
    kill_open_trees()
    remove_home()


atexit.register(_at_exit)


def _forget_the_parents_trees() -> None:
    # A forked child inherits this set, not the trees: they are its parent's to stop. Its
    # exit must not kill them (cgroup.kill, or SIGKILL through an inherited pidfd).
    _open_trees.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing here runs
    os.register_at_fork(after_in_child=_forget_the_parents_trees)


def open_trees() -> set[TreeCore]:
    """The trees not yet cleaned up (the set itself)."""
    return _open_trees


def kill_open_trees() -> None:
    """The net at interpreter exit: SIGKILL every tree still open, and reap its leader.

    Trees whose scope never ended (a task never finished, a loop closed under it) would
    otherwise outlive the interpreter; the watchdog would kill them, but only this process
    can reap its own children.
    """
    kill_at_once(list(_open_trees), when="at interpreter exit")


def kill_at_once(cores: list[TreeCore], *, when: str) -> None:
    """SIGKILL each tree not yet cleaned up, then reap each leader (within its policy's
    ``kill_wait``), blocking: where no cleanup can run (``when`` says where, for the log).
    """
    # Not the trees of the process a child forked in C (no fork handlers ran to forget
    # them) was forked from: its exit killed them (cgroup.kill, or SIGKILL through the
    # inherited pidfd).
    cores = [core for core in cores if core in _open_trees and not core.forked_away]
    killed: list[TreeCore] = []
    for core in cores:
        try:
            with core.lock:  # (a daemon thread's loop may be stopping it right now)
                if core not in _open_trees:
                    continue  # its own cleanup let it go meanwhile (`TreeCore._release`)
                killed.append(core)
                core.containment.kill()
        except ContainmentLost:
            # A bare process group whose leader is reaped, on a kernel that cannot reach
            # the group through the leader's pidfd (before Linux 6.9), cannot be signalled
            # safely any more; its cleanup already sent SIGKILL, and could not confirm it.
            logger.debug("%s: not signalled again %s", core.label, when)
        except OSError as exc:
            if exc is getattr(core.containment, "raised_held", None):
                # Not the hard stop's: an escalation's listing that had failed, said by the
                # hard stop that went out (a cleanup's caller is told; nobody is here).
                logger.debug("%s: killed %s; a listing had failed: %s", core.label, when, exc)
                continue
            # Some of it, maybe: a refused signal (another user's member) is raised only
            # once the rest of the tree had its SIGKILL. Its leader is reaped all the same,
            # or it stays a zombie for good where init does not reap.
            logger.warning("%s: could not kill %s: %s", core.label, when, exc)
        except Exception as exc:  # noqa: BLE001 - one tree's failure must not skip the rest
            # Let out, it skipped every tree after this one: no SIGKILL, no reap (seen when
            # a daemon thread's cleanup and the net pruned one member table at once, a
            # KeyError, helper-94: a race the tree's lock has since closed).
            logger.warning("%s: could not kill %s: %r", core.label, when, exc)
    # Every tree has had its SIGKILL before any is waited for: leaders slow to die (in
    # uninterruptible sleep, say) then cost the longest kill_wait in all, not its sum.
    killed_at = time.monotonic()
    for core in killed:
        # By pidfd, never Popen.wait(): if someone else reaped the leader, its pid may
        # belong to another of our children by now.
        left = killed_at + core.policy.kill_wait - time.monotonic()
        with core.lock:  # (not while the tree's own cleanup reaps it, closing its pidfd)
            core.leader.reap_within(max(left, 0.0))
        if not (core.leader.reaped or core.leader.lost):
            logger.warning("%s: leader not reaped %s", core.label, when)
        _open_trees.discard(core)
