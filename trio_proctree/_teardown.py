"""The escalation as a plain state machine: it says what to do next; the drivers do it.

Written once and driven by the trio driver and the asyncio driver, in the manner of h11:
no I/O here, no clocks, no event loop. The driver reports what happened (did the tree
empty within the wait?) and gets the next action back.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Generator

import attrs

from ._escalation import Escalation, signal_name, time_before_the_hard_stop

logger = logging.getLogger("trio_proctree")


@attrs.frozen
class CloseStdin:
    """Close the tree's stdin pipe (EOF for programs that flush and exit on it)."""


@attrs.frozen
class SendSignal:
    """Send ``signal`` to every process in the tree, then SIGCONT: a stopped process never
    acts on a stop signal, so it is woken to act on it. ``leader_only``: the signal to the
    leader alone, while it runs (else to every process: nobody is left to pass it on)."""

    signal: int
    leader_only: bool = False


@attrs.frozen
class KillAll:
    """Hard-stop every process in the tree (SIGKILL, or the containment's equivalent)."""


@attrs.frozen
class AwaitEmpty:
    """Wait up to ``timeout`` seconds for the tree to empty; report whether it did."""

    timeout: float
    #: A grace the tree is given after a graceful step, which the driver may cut short
    #: (the user interrupted the program: press Ctrl-C again and the tree gets SIGKILL
    #: now). False for the wait after the hard stop.
    grace: bool = True


@attrs.frozen
class LeaderStep:
    """A step that went to the leader alone: its signal, and whether the leader had a
    handler for it when it was sent."""

    signal: int
    caught: bool

    def failed(self, returncode: int | None, *, lost: bool) -> bool:
        """Whether the leader, gone with ``returncode`` (None: not seen, ``lost`` if other
        code reaped it), left without a word that it passed this step on: it died of the
        step's signal without a handler for it, or of another signal (a crash), or was
        reaped elsewhere before its status was seen.

        One that exited with a status, or died of the step's signal that it had a handler
        for (re-raised, its work done, as Python does with an uncaught KeyboardInterrupt),
        had its chance: a server's main process may tell its workers to stop and leave
        without waiting for them, and the step handed on would cut their work short.
        """
        if returncode is None:
            return lost
        return returncode < 0 and not (self.caught and returncode == -self.signal)


@attrs.frozen
class LeaderLeft:
    """The driver's answer to the wait after a step that went to the leader alone: the
    leader is gone, having failed the step (see `Step`), and left members running,
    ``remaining`` seconds before the wait's end."""

    remaining: float


@attrs.frozen
class CutShort:
    """The driver's answer to a grace's wait that the user cut short (a Ctrl-C during
    cleanup), ``waited`` seconds into it: the hard stop now, the graceful steps left
    skipped. The grace did not run out, and is not said to have."""

    waited: float
    #: The tree's last look failed (see `Unseen`): not said to be running.
    unseen: bool = False


@attrs.frozen
class Unseen:
    """The driver's answer to a wait that ran out while the tree could not be looked at
    (its last look failed: no file descriptor left to list it, say). Not emptied, as far
    as anyone knows: the escalation goes on as for a tree still running, but nothing is
    said to be running that was not seen to."""

    def __bool__(self) -> bool:
        return False


@attrs.frozen
class LeaderExited:
    """The driver's answer to a wait that ran out with the leader gone: what still runs
    is what it left (the log must not say that the process it names runs). Not emptied."""

    def __bool__(self) -> bool:
        return False


@attrs.frozen
class Finished:
    """Nothing more to do. ``emptied`` is False only if the tree outlived SIGKILL, or was
    not seen gone after it (``unseen``: it could not be looked at)."""

    emptied: bool
    unseen: bool = False


Action = CloseStdin | SendSignal | KillAll | AwaitEmpty | Finished
#: The plan's steps, each answered by the driver: for AwaitEmpty, whether the tree emptied
#: (or `LeaderLeft`, `CutShort`, `Unseen`, `LeaderExited`); for KillAll, False if it
#: failed (it may have reached only some of the tree, or none of it); else None.
Answer = bool | LeaderLeft | CutShort | Unseen | LeaderExited | None
_Plan = Generator[Action, Answer, Finished]


class Teardown:
    """One run of an `Escalation` against one tree.

    Usage by a driver::

        teardown = Teardown(policy, label="pid 123 (sleep 60)", stdin_open=True)
        action = teardown.start(tree_alive=...)
        while not isinstance(action, Finished):
            ...perform action...
            action = teardown.send(answer)  # see `Answer`

    It also keeps the record of what it asked for, for the cleanup outcome.
    """

    def __init__(
        self, policy: Escalation, *, label: str, stdin_open: bool, killed: bool = False
    ) -> None:
        """``killed``: the program sent the whole tree SIGKILL before cleanup began."""
        self.policy = policy
        self.label = label
        self._stdin_open = stdin_open
        self._killed = killed
        self.signals: list[int] = []
        self.stdin_closed = False
        self.grace_expired = False
        self._plan = self._run()

    def start(self, *, tree_alive: bool) -> Action:
        if not tree_alive:
            logger.debug("%s: nothing left running, no signal needed", self.label)
            return Finished(emptied=True)
        return next(self._plan)

    def send(self, emptied: Answer = None) -> Action:
        try:
            return self._plan.send(emptied)
        except StopIteration as done:
            finished: Finished = done.value
            return finished

    def interrupted(self) -> Action:
        """The first action of the hard stop, in place of the rest of the plan: a Ctrl-C
        was raised in the middle of a step (asyncio raises one wherever Python runs: in
        the driver, or in one of this plan's own log calls, which ends the plan)."""
        logger.warning(
            "%s: cleanup interrupted (Ctrl-C) in the middle of a step; sending SIGKILL to the tree",
            self.label,
        )
        self._plan.close()  # (what is left of it, if it still runs)
        self._plan = self._hard_stop()
        return next(self._plan)

    def _run(self) -> _Plan:
        policy = self.policy
        if self._killed:
            return (yield from self._after_the_programs_kill())
        emptied: Answer = None
        if policy.close_stdin is not None and self._stdin_open:
            logger.debug("%s: closing stdin, waiting up to %gs", self.label, policy.close_stdin)
            self.stdin_closed = True
            yield CloseStdin()
            emptied = yield AwaitEmpty(policy.close_stdin)
            if isinstance(emptied, CutShort):
                return (yield from self._cut_short(emptied, "stdin was closed"))
            if emptied:
                return Finished(emptied=True)
        for step in policy.graceful_steps:
            if logger.isEnabledFor(logging.DEBUG):  # (naming the signal costs, on this path)
                logger.debug(
                    "%s: sending %s to the %s, waiting up to %gs",
                    self.label,
                    signal_name(step.signal),
                    "leader" if step.leader_only else "tree",
                    step.wait,
                )
            # The signal and the SIGCONT that wakes stopped processes to act on it: one
            # action, so that the containment makes one pass over the tree for both.
            self.signals += (step.signal, signal.SIGCONT)
            yield SendSignal(step.signal, step.leader_only)
            emptied = yield AwaitEmpty(step.wait)
            if isinstance(emptied, LeaderLeft):
                # The leader, which alone had the step, is gone without passing it on,
                # and left members running: nobody will pass it on to them now. They get
                # it from us, in what is left of the same wait (the bound holds), instead
                # of sitting it out for SIGKILL with no word to stop.
                logger.debug(
                    "%s: the leader is gone, leaving processes running: %s to them",
                    self.label,
                    signal_name(step.signal),
                )
                self.signals += (step.signal, signal.SIGCONT)
                yield SendSignal(step.signal)
                emptied = yield AwaitEmpty(emptied.remaining)
            if isinstance(emptied, CutShort):
                return (yield from self._cut_short(emptied, signal_name(step.signal)))
            if emptied:
                return Finished(emptied=True)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s: %s", self.label, _seen(emptied, step.wait, step.signal))
        if policy.graceful_steps:
            self.grace_expired = True
            last = policy.graceful_steps[-1]
            logger.warning(
                "%s %s; sending SIGKILL to the tree",
                self.label,
                _seen(emptied, last.wait, last.signal),
            )
        return (yield from self._hard_stop())

    def _after_the_programs_kill(self) -> _Plan:
        # The program killed the tree (``kill()``), and what still runs is dying of it: a
        # stop signal now would reach processes past acting on one, and be recorded as sent
        # (a block that ends right after kill() finds its tree dying, as kill() does not
        # wait). Waited for as after the hard stop, within what this tree's graceful steps
        # would have had (so the bound the docs state holds), and a grace all the same: a
        # Ctrl-C cuts it short. Only what outlives it (missed by the program's SIGKILL, or
        # stuck in the kernel) gets the hard stop.
        policy = self.policy
        wait = min(
            policy.kill_wait, time_before_the_hard_stop(policy, stdin_piped=self._stdin_open)
        )
        if wait == 0:
            # (No time to wait for it: the hard stop at once, as the policy says.)
            logger.debug("%s: killed by the program, no time to wait before SIGKILL", self.label)
        else:
            logger.debug(
                "%s: killed by the program, waiting up to %gs for it to end", self.label, wait
            )
            emptied = yield AwaitEmpty(wait)
            if isinstance(emptied, CutShort):
                return (yield from self._cut_short(emptied, "the program's SIGKILL"))
            if emptied:
                return Finished(emptied=True)
            did, note = _ran_on(emptied)
            logger.warning(
                "%s %s %gs into cleanup, after the program's SIGKILL%s; sending SIGKILL to "
                "the tree",
                self.label,
                did,
                wait,
                note,
            )
        return (yield from self._hard_stop())

    def _cut_short(self, cut: CutShort, after: str) -> _Plan:
        did, note = _ran_on(Unseen() if cut.unseen else False)
        logger.warning(
            "%s %s when cleanup was interrupted (Ctrl-C) %.3gs after %s%s; sending "
            "SIGKILL to the tree",
            self.label,
            did,
            cut.waited,
            after,
            note,
        )
        return (yield from self._hard_stop())

    def _hard_stop(self) -> _Plan:
        policy = self.policy
        logger.debug(
            "%s: sending SIGKILL to the tree, waiting up to %gs", self.label, policy.kill_wait
        )
        self.signals.append(signal.SIGKILL)
        went_out = yield KillAll()
        if emptied := (yield AwaitEmpty(policy.kill_wait, grace=False)):
            return Finished(emptied=True)
        # Blaming the processes (a sleep nothing wakes) when the SIGKILL may not have
        # reached them, or when none was seen at all, would send the reader after the
        # wrong cause: the error raised says why the hard stop failed, or the look did.
        failed = went_out is False
        unseen = isinstance(emptied, Unseen)
        if unseen:
            why = "it could not be looked at"
            if failed:
                why = "the hard stop failed, at least in part, and the tree could not be looked at"
            logger.error(
                "%s: not seen gone %gs after SIGKILL (%s)", self.label, policy.kill_wait, why
            )
        else:
            why = "the hard stop failed, at least in part" if failed else "uninterruptible sleep?"
            logger.error(
                "%s: processes still alive %gs after SIGKILL (%s)",
                self.label,
                policy.kill_wait,
                why,
            )
        return Finished(emptied=False, unseen=unseen)


def _seen(emptied: Answer, wait: float, sig: int) -> str:
    """How a wait of ``wait`` seconds after ``sig`` that ran out saw the tree (`_ran_on`)."""
    did, note = _ran_on(emptied)
    return f"{did} {wait:g}s after {signal_name(sig)}{note}"


def _ran_on(emptied: Answer) -> tuple[str, str]:
    """What a wait that ran out saw the tree do, and a note for after its time: still
    running; or what its leader left still running (`LeaderExited`); or, when the look at
    it failed (`Unseen`), not seen gone."""
    if isinstance(emptied, Unseen):
        return "not seen gone", " (it could not be looked at)"
    if isinstance(emptied, LeaderExited):
        return "exited, leaving processes that were still running", ""
    return "still running", ""
