"""The stop policy: what cleanup does to a live tree, in what order, and how long it may take."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterable
from typing import Any

import attrs

SignalLike = int | str

#: Signals that cannot end a process, so they make no sense as a stop signal:
#: SIGSTOP only suspends the tree (and cleanup follows every stop signal with SIGCONT),
#: and SIGCONT resumes it.
_NOT_STOP_SIGNALS = frozenset(
    getattr(signal, name) for name in ("SIGSTOP", "SIGCONT") if hasattr(signal, name)
)  # (neither exists on Windows, where importing the package must still work)

#: None on Windows, where importing the package (and being told it is not supported) must
#: still work.
_SIGKILL = getattr(signal, "SIGKILL", None)

DEFAULT_GRACE = 5.0
#: The wait after SIGKILL when the policy gives none.
DEFAULT_KILL_WAIT = 2.0
DEFAULT_STOP_SIGNAL = signal.SIGTERM

#: Every signal number this platform accepts, as plain ints. Asked once: each call of
#: `signal.valid_signals` turns every number into an enum member (~60 us per tree spawned).
_VALID_SIGNALS = frozenset(int(sig) for sig in signal.valid_signals())


def parse_signal(value: SignalLike, *, what: str = "signal") -> int:
    """Return ``value`` as a valid signal number (a `signal.Signals` member where one exists).

    Accepts an int, a `signal.Signals` member, or a name such as ``"SIGTERM"`` or ``"TERM"``.

    Raises:
        ValueError: if ``value`` names no signal this platform has.
    """
    if isinstance(value, bool):
        # bool is an int subclass: True would silently mean SIGHUP.
        raise ValueError(f"{what} must be a signal, not {value!r}")
    if isinstance(value, str):
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            return signal.Signals[name]
        except KeyError:
            raise ValueError(f"{what} {value!r} is not a signal name on this platform") from None
    if not isinstance(value, int):
        raise ValueError(f"{what} must be a signal number or name, not {value!r}")
    if value not in _VALID_SIGNALS:
        raise ValueError(f"{what} {value!r} is not a valid signal on this platform")
    try:
        return signal.Signals(value)
    except ValueError:
        return value  # a real-time signal without a name of its own


def parse_stop_signal(value: SignalLike) -> int:
    """Like `parse_signal`, and also refuse signals that cannot stop a process."""
    sig = parse_signal(value, what="stop signal")
    if sig in _NOT_STOP_SIGNALS:
        raise ValueError(
            f"stop signal {signal_name(sig)} cannot stop a process tree; use e.g. SIGTERM"
        )
    return sig


def parse_duration(value: float, *, what: str, least: str = ">= 0") -> float:
    """Return ``value`` as seconds, refusing negative, NaN and infinite values (said to
    be not ``least``: a caller that also refuses 0 says "> 0")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float (10**400): no finite wait either
        seconds = math.inf
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        huge = isinstance(value, int) and seconds == math.inf
        sign = "a negative " if huge and value < 0 else "an "
        shown = f"{sign}integer of {int(value).bit_length()} bits" if huge else repr(value)
        raise ValueError(f"{what} must be a finite number of seconds {least}, not {shown}")
    return seconds


def signal_name(sig: int) -> str:
    """``"SIGTERM"`` for 15; ``"signal 40"`` for a signal without a name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _step_wait(value: float) -> float:
    return parse_duration(value, what="step wait")


def _optional_stdin_wait(value: float | None) -> float | None:
    return None if value is None else parse_duration(value, what="close_stdin")


def _kill_wait(value: float) -> float:
    seconds = parse_duration(value, what="kill_wait", least="> 0")
    if seconds == 0:
        # SIGKILL takes a moment to land: a cleanup that may not wait for it would look
        # once, too early, and report processes outliving SIGKILL, the leader unreaped.
        # (A wait of microseconds can be as short: that is the caller's to choose.)
        raise ValueError(
            "kill_wait must be a finite number of seconds > 0, not 0: SIGKILL takes a "
            "moment to land"
        )
    return seconds


def _leader_only(value: bool) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"leader_only must be True or False, not {value!r}")
    return value


@attrs.frozen
class Step:
    """One escalation step: send ``signal`` to every process in the tree, then wait up to
    ``wait`` seconds for the tree to empty.

    With ``leader_only``, the signal goes to the leader alone, which is to stop the rest
    its own way (a server's main process its workers, in order; as systemd's
    ``KillMode=mixed`` does), and SIGCONT to every process; the wait is still for the
    whole tree. A leader already gone when the step comes cannot pass it on: the step then
    goes to every process. One that leaves members running as it goes during the wait
    hands the step on, if it failed it: it died of the step's signal without a handler
    for it, or of another signal (a crash), or was reaped by other code before its status
    was seen. The signal then goes to every process left, in what remains of the same
    wait. One that exited with a status, or re-raised the step's signal it had a handler
    for (as Python does after an uncaught KeyboardInterrupt), had its chance: it may have
    told the rest to stop and left without waiting; what it left gets the next step, or
    SIGKILL at the end. (A handler the runtime installed counts: every Python program has
    one for SIGINT, KeyboardInterrupt's, and Node and Go handle SIGTERM for the program,
    so such leaders are trusted. To be sure the rest gets the signal, follow the step
    with one for every process: ``[Step(SIGTERM, 10, leader_only=True), Step(SIGTERM,
    5)]``. Where /proc hides the leader's handlers, from ``hidepid``, it is taken to have
    none.) SIGKILL cannot be for the leader alone: it ends the graceful steps and reaches
    every process.
    """

    #: The signal sent (a number; given as a ``signal.Signals``, an int or a name such as
    #: ``"SIGTERM"`` or ``"TERM"``).
    signal: int = attrs.field(converter=parse_stop_signal)
    #: Seconds to wait, at most, for the tree to empty after the signal.
    wait: float = attrs.field(converter=_step_wait)
    #: Whether the signal goes to the leader alone (see above); SIGCONT goes to all.
    leader_only: bool = attrs.field(default=False, converter=_leader_only)

    def __attrs_post_init__(self) -> None:
        if self.leader_only and self.signal == _SIGKILL:
            raise ValueError(
                "a SIGKILL step ends the graceful steps and reaches every process: it "
                "cannot be for the leader alone"
            )


def _as_step(step: Step | tuple[SignalLike, float] | tuple[SignalLike, float, bool]) -> Step:
    if isinstance(step, Step):
        return step
    if isinstance(step, (str, bytes)) or not all(
        hasattr(step, method) for method in ("__len__", "__getitem__")
    ):  # (not Sequence alone: a step read by index from a table row is one too)
        raise TypeError(f"a step is (signal, wait) or (signal, wait, leader_only), not {step!r}")
    if len(step) == 2:
        return Step(step[0], step[1])
    if len(step) == 3:
        return Step(step[0], step[1], leader_only=step[2])
    raise ValueError(f"a step is (signal, wait) or (signal, wait, leader_only), not {step!r}")


def _as_steps(
    steps: Iterable[Step | tuple[SignalLike, float] | tuple[SignalLike, float, bool]],
) -> tuple[Step, ...]:
    # One step given bare, where a sequence of them is asked for: said so, where it read as
    # "'Step' object is not iterable", or as a pair taken apart into steps (helper-92).
    if isinstance(steps, Step):
        raise TypeError(f"{_NOT_STEPS}a Step (for one step: steps=[Step(...)])")
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise TypeError(f"{_NOT_STEPS}{steps!r}")
    if _a_bare_step(steps := list(steps)):
        shape = "(signal, wait)" if len(steps) == 2 else "(signal, wait, leader_only)"
        raise TypeError(f"{_NOT_STEPS}one {shape} step (for one step: steps=[{shape}])")
    converted = tuple(_as_step(step) for step in steps)
    if not converted:
        raise ValueError("an Escalation needs at least one (signal, wait) step")
    if any(step.signal == _SIGKILL for step in converted[:-1]):
        raise ValueError(
            "a SIGKILL step ends the escalation: it must be the last step (the steps after "
            "it would never run)"
        )
    return converted


_NOT_STEPS = "steps is a sequence of steps (Step values or (signal, wait) pairs), not "


def _a_bare_step(steps: list[Any]) -> bool:
    """Whether ``steps`` reads as one ``(signal, wait)`` step, not a sequence of them."""
    return (
        len(steps) in (2, 3)
        and isinstance(steps[0], (int, str))
        and isinstance(steps[1], (int, float))
        and not isinstance(steps[1], bool)
    )


class _NotGiven(float):
    """``kill_wait``'s default: not given (then 2 s, or the wait of a last SIGKILL step).
    One object, never one a caller can pass; said so where the signature is shown (help(),
    IDEs, the docs), where its value, nan, read like a bug (helper-52)."""

    def __repr__(self) -> str:
        return "<2 s, or a last SIGKILL step's wait>"


_NOT_GIVEN = _NotGiven("nan")


def _kill_wait_if_given(value: float) -> float:
    return value if value is _NOT_GIVEN else _kill_wait(value)


@attrs.frozen
class Escalation:
    """How cleanup stops a tree that is still running.

    In order:

    1. if ``close_stdin`` is set and the tree's stdin was made a pipe, close it (unless
       closed already: by the program, or by `run_process_tree` once it fed the input,
       which it goes on feeding during the wait, while the tree takes it) and
       wait up to ``close_stdin`` seconds (for CLIs that flush their last output on EOF).
       The wait runs also where stdin was closed already, counted from the cleanup's
       start, not from that close: a CLI still finishing its input gets it in full, and
       where the program took the stream off the tree (``tree.stdin = None``; cleanup
       leaves it open), a task of the program's may close it meanwhile;
    2. for each `Step`: send its signal to every process in the tree (or, with
       ``leader_only``, to the leader alone), then SIGCONT to every process (so that
       stopped members can act on it), and wait up to its ``wait``;
    3. SIGKILL every process in the tree and wait up to ``kill_wait`` (more than 0; 2 s
       unless given) for it to be gone. A last step with SIGKILL is this hard stop, its
       wait the ``kill_wait``: ``[(SIGTERM, 5.0), (SIGKILL, 3.0)]`` is SIGTERM, 5 s,
       SIGKILL, 3 s (a ``kill_wait`` given beside it must be the same, but for the
       default, 2 s, which counts as none: ``attrs.evolve`` passes it on).

    Cleanup stops at the first wait in which the tree empties. Cleanup runs shielded from
    cancellation, so a caller's timeout does not cut it short: `worst_case` is its bound.

    ``Escalation(steps=[(signal.SIGINT, 2.0), (signal.SIGTERM, 3.0)], close_stdin=1.0)``
    """

    #: The graceful steps, in order (given as `Step` values or ``(signal, wait)`` and
    #: ``(signal, wait, leader_only)`` tuples); SIGTERM and 5 s by default.
    steps: tuple[Step, ...] = attrs.field(
        default=(Step(DEFAULT_STOP_SIGNAL, DEFAULT_GRACE),),
        converter=_as_steps,
    )
    #: Seconds to wait after closing the tree's stdin, before the first step; None (the
    #: default): no such step.
    close_stdin: float | None = attrs.field(default=None, converter=_optional_stdin_wait)
    #: Seconds to wait, at most, for the tree to be gone after SIGKILL (2 s by default).
    kill_wait: float = attrs.field(default=_NOT_GIVEN, converter=_kill_wait_if_given)

    def __attrs_post_init__(self) -> None:
        last, given = self.steps[-1], None if self.kill_wait is _NOT_GIVEN else self.kill_wait
        if last.signal != _SIGKILL:
            wait = DEFAULT_KILL_WAIT if given is None else given
        elif given in (None, last.wait, DEFAULT_KILL_WAIT):
            # (The default given is taken for none: `attrs.evolve` passes every field on,
            # and a policy evolved to end in a SIGKILL step was refused for a clash that
            # nobody asked for. The same as ``grace=5.0`` beside ``escalation=``.)
            wait = _kill_wait(last.wait)
        else:
            raise ValueError(
                f"the SIGKILL step's wait ({last.wait:g}s) is the kill_wait, which was also "
                f"given ({given:g}s): give one of them"
            )
        object.__setattr__(self, "kill_wait", wait)  # (frozen: set once, here)

    @classmethod
    def graceful(
        cls, grace: float = DEFAULT_GRACE, stop_signal: SignalLike = DEFAULT_STOP_SIGNAL
    ) -> Escalation:
        """The common policy: ``stop_signal``, up to ``grace`` seconds, then SIGKILL.
        With SIGKILL as the stop signal there is no grace: the hard stop at once."""
        step = Step(stop_signal, parse_duration(grace, what="grace"))
        if step.signal == _SIGKILL:
            # Not a SIGKILL step of this wait: ``grace`` is no wait after SIGKILL (a grace of
            # 0 would be refused as one, and a tiny one give up on the dying).
            return cls(steps=(Step(step.signal, DEFAULT_KILL_WAIT),))
        return cls(steps=(step,))

    @property
    def graceful_steps(self) -> tuple[Step, ...]:
        """The steps before the hard stop (a last step with SIGKILL is that hard stop)."""
        return self.steps[:-1] if self.steps[-1].signal == _SIGKILL else self.steps

    @property
    def worst_case(self) -> float:
        """The longest cleanup can take, in seconds, every wait running out in full."""
        return time_before_the_hard_stop(self, stdin_piped=True) + self.kill_wait


def time_before_the_hard_stop(policy: Escalation, *, stdin_piped: bool) -> float:
    """The most the waits before SIGKILL (close stdin, each step's) take, in seconds, for
    a tree whose stdin is a pipe (``stdin_piped``: the close-stdin step runs) or not."""
    waits = sum(step.wait for step in policy.graceful_steps)
    close_stdin = (policy.close_stdin or 0.0) if stdin_piped else 0.0
    return close_stdin + waits


def resolve_policy(
    grace: float, stop_signal: SignalLike, escalation: Escalation | None
) -> Escalation:
    """Turn the ``grace`` / ``stop_signal`` shortcuts or a full ``escalation`` into one policy."""
    if escalation is None:
        if type(grace) is float and grace == DEFAULT_GRACE and stop_signal is DEFAULT_STOP_SIGNAL:
            # The defaults, on nearly every spawn: one frozen policy serves them all (its
            # making and checking is ~15 us on the event loop, a tree).
            return _DEFAULT_POLICY
        return Escalation.graceful(grace, stop_signal)
    if not isinstance(escalation, Escalation):
        raise ValueError(f"escalation must be an Escalation, not {escalation!r}")
    if grace != DEFAULT_GRACE or stop_signal != DEFAULT_STOP_SIGNAL:
        raise ValueError("pass either escalation= or grace=/stop_signal=, not both")
    return escalation


_DEFAULT_POLICY = Escalation.graceful()
