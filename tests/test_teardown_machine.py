"""The escalation as a state machine, without processes: the actions it asks for, in
order, for each answer, and what it records and logs. (The drivers are tested with real
processes elsewhere; this pins the policy itself, fast.)"""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

import attrs
import pytest

from trio_proctree import Escalation, Step
from trio_proctree._escalation import (
    parse_duration,
    parse_signal,
    resolve_policy,
    signal_name,
)
from trio_proctree._teardown import (
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

LABEL = "pid 42 (make -j8)"
MUST = "must be a finite number of seconds >= 0, not"


def drive(teardown: Teardown, answers: Sequence[Answer], *, alive: bool = True) -> list[Action]:
    """Run the machine: each AwaitEmpty gets the next answer (did the tree empty?)."""
    actions = [teardown.start(tree_alive=alive)]
    replies = iter(answers)
    while not isinstance(actions[-1], Finished):
        emptied = next(replies) if isinstance(actions[-1], AwaitEmpty) else None
        actions.append(teardown.send(emptied))
    assert next(replies, None) is None, "every answer was used"
    return actions


def test_an_empty_tree_is_left_alone() -> None:
    teardown = Teardown(Escalation(), label=LABEL, stdin_open=True)
    assert drive(teardown, [], alive=False) == [Finished(emptied=True)]
    assert teardown.signals == []
    assert teardown.grace_expired is False  # booleans, not merely falsy: the outcome's fields
    assert teardown.stdin_closed is False


def test_a_cooperative_tree_gets_the_stop_signal_and_sigcont_only() -> None:
    teardown = Teardown(Escalation.graceful(3.0), label=LABEL, stdin_open=False)
    assert drive(teardown, [True]) == [
        SendSignal(signal.SIGTERM),
        AwaitEmpty(3.0),
        Finished(emptied=True),
    ]
    assert teardown.signals == [signal.SIGTERM, signal.SIGCONT]
    assert not teardown.grace_expired


def test_a_step_can_be_for_the_leader_alone() -> None:
    step = Step(signal.SIGTERM, 1.0, leader_only=True)
    assert step.leader_only is True
    assert Step(signal.SIGTERM, 1.0).leader_only is False
    assert Escalation(steps=[(signal.SIGTERM, 1.0, True)]).steps == (step,)
    assert Escalation(steps=[(signal.SIGTERM, 1.0)]).steps[0].leader_only is False


@pytest.mark.parametrize("step", [(signal.SIGTERM,), (signal.SIGTERM, 1.0, True, "more")])
def test_a_step_of_another_shape_is_refused(step: tuple[object, ...]) -> None:
    with pytest.raises(ValueError) as refused:
        Escalation(steps=[step])  # type: ignore[list-item]
    assert str(refused.value) == (
        f"a step is (signal, wait) or (signal, wait, leader_only), not {step!r}"
    )


@pytest.mark.parametrize(
    ("steps", "not_"),
    [
        (Step(signal.SIGTERM, 1.0), "a Step (for one step: steps=[Step(...)])"),
        ((signal.SIGTERM, 1.0), "one (signal, wait) step (for one step: steps=[(signal, wait)])"),
        (
            (signal.SIGTERM, 1.0, True),
            "one (signal, wait, leader_only) step (for one step: "
            "steps=[(signal, wait, leader_only)])",
        ),
        (None, "None"),
        ("TERM", "'TERM'"),
    ],
)
def test_steps_given_as_something_other_than_steps_are_refused_by_what_they_are(
    steps: object, not_: str
) -> None:
    # Red before (helper-92): "'Step' object is not iterable", or a step taken apart:
    # steps=(SIGTERM, 1.0) read as two steps, and "object of type 'int' has no len()".
    with pytest.raises(TypeError) as refused:
        Escalation(steps=steps)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"steps is a sequence of steps (Step values or (signal, wait) pairs), not {not_}"
    )


@pytest.mark.parametrize("step", [signal.SIGTERM, 15, None, 1.5])
def test_a_step_that_is_no_sequence_is_refused_as_one(step: object) -> None:
    with pytest.raises(TypeError) as refused:
        Escalation(steps=[step])  # type: ignore[list-item]
    assert str(refused.value) == (
        f"a step is (signal, wait) or (signal, wait, leader_only), not {step!r}"
    )


def test_a_step_read_by_index_is_a_step_though_no_sequence() -> None:
    # As a row of a table (numpy's, say): len() and [] are all a step needs (helper-93:
    # refused for a while, as no collections.abc.Sequence).
    class Row:
        def __init__(self, *cells: object) -> None:
            self.cells = cells

        def __len__(self) -> int:
            return len(self.cells)

        def __getitem__(self, index: int) -> object:
            return self.cells[index]

    assert Escalation(steps=[Row(signal.SIGTERM, 1.0)]).steps == (Step(signal.SIGTERM, 1.0),)  # type: ignore[list-item]


def test_a_sigkill_step_cannot_be_for_the_leader_alone() -> None:
    # It would end the graceful steps there (graceful_steps stops at SIGKILL) and reach
    # every process: silently not what was asked (helper-4).
    with pytest.raises(ValueError) as refused:
        Step(signal.SIGKILL, 3.0, leader_only=True)
    assert str(refused.value) == (
        "a SIGKILL step ends the graceful steps and reaches every process: it cannot be "
        "for the leader alone"
    )
    assert Step(signal.SIGKILL, 3.0).leader_only is False


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_leader_only_must_be_true_or_false(flag: object) -> None:
    with pytest.raises(ValueError) as refused:
        Step(signal.SIGTERM, 1.0, leader_only=flag)  # type: ignore[arg-type]
    assert str(refused.value) == f"leader_only must be True or False, not {flag!r}"


def test_a_step_for_the_leader_alone_is_asked_of_the_driver_as_such(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Escalation(steps=[Step(signal.SIGTERM, 1.0, leader_only=True), (signal.SIGINT, 2.0)])
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    with caplog.at_level(logging.DEBUG, logger="trio_proctree"):
        assert drive(teardown, [False, True]) == [
            SendSignal(signal.SIGTERM, leader_only=True),
            AwaitEmpty(1.0),
            SendSignal(signal.SIGINT, leader_only=False),
            AwaitEmpty(2.0),
            Finished(emptied=True),
        ]
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL}: sending SIGTERM to the leader, waiting up to 1s",
        f"{LABEL}: still running 1s after SIGTERM",
        f"{LABEL}: sending SIGINT to the tree, waiting up to 2s",
    ]
    # (Recorded as sent, the leader-only ones too: the outcome's signals are cleanup's.)
    assert teardown.signals == [signal.SIGTERM, signal.SIGCONT, signal.SIGINT, signal.SIGCONT]


def test_a_leader_that_left_members_hands_its_step_on_within_the_same_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The driver says the leader exited 2.5 s into the step's 4 s, leaving members: they
    # get the step's signal in what is left of its wait (the bound unchanged).
    policy = Escalation(steps=[Step(signal.SIGTERM, 4.0, leader_only=True)])
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    with caplog.at_level(logging.DEBUG, logger="trio_proctree"):
        assert drive(teardown, [LeaderLeft(1.5), True]) == [
            SendSignal(signal.SIGTERM, leader_only=True),
            AwaitEmpty(4.0),
            SendSignal(signal.SIGTERM, leader_only=False),
            AwaitEmpty(1.5),
            Finished(emptied=True),
        ]
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL}: sending SIGTERM to the leader, waiting up to 4s",
        f"{LABEL}: the leader is gone, leaving processes running: SIGTERM to them",
    ]
    assert teardown.signals == [signal.SIGTERM, signal.SIGCONT] * 2
    assert not teardown.grace_expired


def test_what_a_leader_left_goes_on_to_the_next_step_if_the_handed_on_one_fails() -> None:
    policy = Escalation(
        steps=[Step(signal.SIGTERM, 4.0, leader_only=True), (signal.SIGINT, 1.0)], kill_wait=0.5
    )
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    assert drive(teardown, [LeaderLeft(3.0), False, False, True]) == [
        SendSignal(signal.SIGTERM, leader_only=True),
        AwaitEmpty(4.0),
        SendSignal(signal.SIGTERM),
        AwaitEmpty(3.0),
        SendSignal(signal.SIGINT),
        AwaitEmpty(1.0),
        KillAll(),
        AwaitEmpty(0.5, grace=False),
        Finished(emptied=True),
    ]
    assert teardown.grace_expired


def test_grace_running_out_brings_sigkill() -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    assert drive(teardown, [False, True]) == [
        SendSignal(signal.SIGTERM),
        AwaitEmpty(1.0),
        KillAll(),
        AwaitEmpty(0.5, grace=False),  # the hard stop is waited out, never cut short
        Finished(emptied=True),
    ]
    assert teardown.signals == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert teardown.grace_expired


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_ctrl_c_in_a_grace_brings_sigkill_at_once_and_no_grace_ran_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Red before: the driver answered False, as for a grace that ran out: the steps left
    # were each sent and cut short in turn, the outcome said the grace had run out, and
    # the warning that it had lasted its full 1 s.
    policy = Escalation(steps=[(signal.SIGINT, 1.0), (signal.SIGTERM, 2.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        assert drive(teardown, [CutShort(0.25), True]) == [
            SendSignal(signal.SIGINT),
            AwaitEmpty(1.0),
            KillAll(),
            AwaitEmpty(0.5, grace=False),
            Finished(emptied=True),
        ]
    assert teardown.signals == [signal.SIGINT, signal.SIGCONT, signal.SIGKILL]
    assert teardown.grace_expired is False
    assert warnings_of(caplog) == [
        f"{LABEL} still running when cleanup was interrupted (Ctrl-C) 0.25s after SIGINT; "
        "sending SIGKILL to the tree"
    ]


def test_a_ctrl_c_in_a_grace_the_tree_could_not_be_seen_in_does_not_say_it_ran_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Red before: "still running when cleanup was interrupted", though cleanup's last look
    # at the tree had failed (out of descriptors): it was not seen at all (helper-81).
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        drive(teardown, [CutShort(0.25, unseen=True), True])
    assert warnings_of(caplog) == [
        f"{LABEL} not seen gone when cleanup was interrupted (Ctrl-C) 0.25s after SIGTERM "
        "(it could not be looked at); sending SIGKILL to the tree"
    ]


def test_a_ctrl_c_after_stdin_was_closed_brings_sigkill_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=2.0, kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=True)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        assert drive(teardown, [CutShort(1.5), True]) == [
            CloseStdin(),
            AwaitEmpty(2.0),
            KillAll(),
            AwaitEmpty(0.5, grace=False),
            Finished(emptied=True),
        ]
    assert teardown.signals == [signal.SIGKILL]
    assert warnings_of(caplog) == [
        f"{LABEL} still running when cleanup was interrupted (Ctrl-C) 1.5s after stdin was "
        "closed; sending SIGKILL to the tree"
    ]


def test_a_ctrl_c_in_what_a_leader_left_brings_sigkill_at_once() -> None:
    policy = Escalation(steps=[Step(signal.SIGTERM, 4.0, leader_only=True)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    assert drive(teardown, [LeaderLeft(3.0), CutShort(2.0), True])[-3:] == [
        KillAll(),
        AwaitEmpty(0.5, grace=False),
        Finished(emptied=True),
    ]
    assert teardown.grace_expired is False


def test_a_ctrl_c_after_the_programs_kill_brings_the_hard_stop_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 3.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False, killed=True)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        assert drive(teardown, [CutShort(0.1), True]) == [
            AwaitEmpty(0.5, grace=True),
            KillAll(),
            AwaitEmpty(0.5, grace=False),
            Finished(emptied=True),
        ]
    assert warnings_of(caplog) == [
        f"{LABEL} still running when cleanup was interrupted (Ctrl-C) 0.1s after the "
        "program's SIGKILL; sending SIGKILL to the tree"
    ]


def test_a_tree_outliving_sigkill_is_reported_not_emptied() -> None:
    teardown = Teardown(Escalation.graceful(1.0), label=LABEL, stdin_open=False)
    assert drive(teardown, [False, False])[-1] == Finished(emptied=False)


def test_a_tree_the_program_killed_is_waited_for_without_a_signal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 3.0)], close_stdin=1.0, kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=True, killed=True)
    # No close-stdin step, no stop signal: what runs is dying of the program's SIGKILL.
    # A grace all the same (grace=True): a Ctrl-C cuts it short.
    with caplog.at_level(logging.DEBUG, logger="trio_proctree"):
        assert drive(teardown, [True]) == [AwaitEmpty(0.5, grace=True), Finished(emptied=True)]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, f"{LABEL}: killed by the program, waiting up to 0.5s for it to end")
    ]
    assert teardown.signals == []
    assert teardown.stdin_closed is False
    assert teardown.grace_expired is False


def test_what_outlives_the_programs_kill_gets_the_hard_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 3.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False, killed=True)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        assert drive(teardown, [False, True]) == [
            AwaitEmpty(0.5, grace=True),
            KillAll(),
            AwaitEmpty(0.5, grace=False),
            Finished(emptied=True),
        ]
    assert teardown.signals == [signal.SIGKILL]
    assert teardown.grace_expired is False  # no grace was given: the program chose SIGKILL
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL} still running 0.5s into cleanup, after the program's SIGKILL; "
        "sending SIGKILL to the tree"
    ]


@pytest.mark.parametrize("after_the_programs_kill", [False, True])
def test_a_wait_that_ran_out_with_the_leader_gone_says_so(
    caplog: pytest.LogCaptureFixture, after_the_programs_kill: bool
) -> None:
    # The label names the leader: what runs on is what it left (red before, helper-52 and
    # helper-53: "pid 42 (make -j8) still running", the leader long gone).
    policy = Escalation(steps=[(signal.SIGTERM, 3.0)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False, killed=after_the_programs_kill)
    with caplog.at_level(logging.WARNING, logger="trio_proctree"):
        assert drive(teardown, [LeaderExited(), True])[-1] == Finished(emptied=True)
    when = (
        "0.5s into cleanup, after the program's SIGKILL"
        if after_the_programs_kill
        else ("3s after SIGTERM")
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL} exited, leaving processes that were still running {when}; "
        "sending SIGKILL to the tree"
    ]


def test_a_killed_tree_with_no_time_before_the_hard_stop_gets_it_at_once_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # grace 0: nothing to wait before SIGKILL, so nothing is waited, and nothing warned
    # of (the tree has not outlived anything).
    policy = Escalation.graceful(0.0)
    teardown = Teardown(policy, label=LABEL, stdin_open=False, killed=True)
    with caplog.at_level(logging.DEBUG, logger="trio_proctree"):
        assert drive(teardown, [True]) == [
            KillAll(),
            AwaitEmpty(policy.kill_wait, grace=False),
            Finished(emptied=True),
        ]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, f"{LABEL}: killed by the program, no time to wait before SIGKILL"),
        (logging.DEBUG, f"{LABEL}: sending SIGKILL to the tree, waiting up to 2s"),
    ]
    assert teardown.signals == [signal.SIGKILL]


@pytest.mark.parametrize(
    ("close_stdin", "stdin_open", "first"),
    [(None, False, 0.2), (5.0, False, 0.2), (5.0, True, 2.0), (0.1, True, 0.3)],
)
def test_the_wait_after_the_programs_kill_keeps_within_this_trees_bound(
    close_stdin: float | None, stdin_open: bool, first: float
) -> None:
    # The first wait takes only what this tree's graceful steps would have had (the
    # close-stdin step only for a stdin that is a pipe), so a killed tree's cleanup takes
    # no longer than the same tree's would have.
    policy = Escalation(steps=[(signal.SIGTERM, 0.2)], close_stdin=close_stdin, kill_wait=2.0)
    teardown = Teardown(policy, label=LABEL, stdin_open=stdin_open, killed=True)
    actions = drive(teardown, [False, True])
    waits = [action.timeout for action in actions if isinstance(action, AwaitEmpty)]
    assert waits == pytest.approx([first, policy.kill_wait])
    unkilled = Teardown(policy, label=LABEL, stdin_open=stdin_open)
    graceful_waits = 1 + (close_stdin is not None and stdin_open)
    longest = drive(unkilled, [False] * graceful_waits + [True])
    assert sum(waits) <= sum(a.timeout for a in longest if isinstance(a, AwaitEmpty)) + 1e-9


def test_close_stdin_comes_first_and_can_be_enough() -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=2.0)
    teardown = Teardown(policy, label=LABEL, stdin_open=True)
    assert drive(teardown, [True]) == [CloseStdin(), AwaitEmpty(2.0), Finished(emptied=True)]
    assert teardown.stdin_closed
    assert teardown.signals == []


def test_close_stdin_then_signals_when_eof_is_not_enough() -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=2.0)
    teardown = Teardown(policy, label=LABEL, stdin_open=True)
    assert drive(teardown, [False, True])[:3] == [
        CloseStdin(),
        AwaitEmpty(2.0),
        SendSignal(signal.SIGTERM),
    ]


def test_close_stdin_is_skipped_without_a_stdin_pipe() -> None:
    policy = Escalation(steps=[(signal.SIGTERM, 1.0)], close_stdin=2.0)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    assert drive(teardown, [True])[0] == SendSignal(signal.SIGTERM)
    assert not teardown.stdin_closed


def test_steps_run_in_order_each_with_its_own_wait() -> None:
    policy = Escalation(steps=[(signal.SIGINT, 0.5), (signal.SIGTERM, 1.5)])
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    actions = drive(teardown, [False, True])
    assert actions == [
        SendSignal(signal.SIGINT),
        AwaitEmpty(0.5),
        SendSignal(signal.SIGTERM),
        AwaitEmpty(1.5),
        Finished(emptied=True),
    ]
    assert not teardown.grace_expired


def test_a_sigkill_step_is_the_hard_stop_itself() -> None:
    policy = Escalation(steps=[(signal.SIGKILL, 0.25)])
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    assert drive(teardown, [True]) == [
        KillAll(),
        AwaitEmpty(0.25, grace=False),
        Finished(emptied=True),
    ]
    assert teardown.signals == [signal.SIGKILL]
    assert not teardown.grace_expired  # there was no grace to run out


def test_each_step_is_logged_and_the_grace_running_out_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    policy = Escalation(steps=[(signal.SIGINT, 0.5), (signal.SIGTERM, 1.5)], close_stdin=2.0)
    drive(Teardown(policy, label=LABEL, stdin_open=True), [False, False, False, True])
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages == [
        (logging.DEBUG, f"{LABEL}: closing stdin, waiting up to 2s"),
        (logging.DEBUG, f"{LABEL}: sending SIGINT to the tree, waiting up to 0.5s"),
        (logging.DEBUG, f"{LABEL}: still running 0.5s after SIGINT"),
        (logging.DEBUG, f"{LABEL}: sending SIGTERM to the tree, waiting up to 1.5s"),
        (logging.DEBUG, f"{LABEL}: still running 1.5s after SIGTERM"),
        (logging.WARNING, f"{LABEL} still running 1.5s after SIGTERM; sending SIGKILL to the tree"),
        (logging.DEBUG, f"{LABEL}: sending SIGKILL to the tree, waiting up to 2s"),
    ]


def test_nothing_to_stop_is_logged_and_outliving_sigkill_is_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    drive(Teardown(Escalation(), label=LABEL, stdin_open=False), [], alive=False)
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL}: nothing left running, no signal needed"
    ]
    caplog.clear()
    drive(Teardown(Escalation(kill_wait=0.5), label=LABEL, stdin_open=False), [False, False])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"{LABEL}: processes still alive 0.5s after SIGKILL (uninterruptible sleep?)"]


def test_a_tree_left_by_a_failed_hard_stop_is_not_blamed_on_its_processes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Red before: the log blamed an uninterruptible sleep when no SIGKILL had gone out.
    caplog.set_level(logging.ERROR, logger="trio_proctree")
    teardown = Teardown(Escalation(kill_wait=0.5), label=LABEL, stdin_open=False)
    actions = [teardown.start(tree_alive=True)]
    assert actions == [SendSignal(signal.SIGTERM)]
    for answer in [None, False, False, False]:  # sent; grace ran out; SIGKILL failed; alive
        actions.append(teardown.send(answer))
    assert actions[2:] == [KillAll(), AwaitEmpty(0.5, grace=False), Finished(emptied=False)]
    errors = [r.getMessage() for r in caplog.records]
    assert errors == [
        f"{LABEL}: processes still alive 0.5s after SIGKILL "
        "(the hard stop failed, at least in part)"
    ]


@pytest.mark.parametrize("hard_stop_went_out", [True, False])
def test_a_tree_that_could_not_be_looked_at_is_said_not_seen_gone_not_running(
    caplog: pytest.LogCaptureFixture, hard_stop_went_out: bool
) -> None:
    # Red before: with every look at the tree failing (no descriptor left to list it), the
    # log said it was still running, and still alive after SIGKILL, in a sleep nothing
    # wakes; the escalation itself goes on as for a tree still running.
    caplog.set_level(logging.DEBUG, logger="trio_proctree")
    policy = Escalation(steps=[(signal.SIGTERM, 0.2)], kill_wait=0.5)
    teardown = Teardown(policy, label=LABEL, stdin_open=False)
    actions = [teardown.start(tree_alive=True)]
    # sent; ran out unseen; SIGKILL sent (or failed); ran out unseen
    for answer in [None, Unseen(), None if hard_stop_went_out else False, Unseen()]:
        actions.append(teardown.send(answer))
    assert actions == [
        SendSignal(signal.SIGTERM),
        AwaitEmpty(0.2),
        KillAll(),
        AwaitEmpty(0.5, grace=False),
        Finished(emptied=False, unseen=True),
    ]
    assert teardown.grace_expired
    unseen = "(it could not be looked at)"
    why = unseen
    if not hard_stop_went_out:
        why = "(the hard stop failed, at least in part, and the tree could not be looked at)"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, f"{LABEL}: sending SIGTERM to the tree, waiting up to 0.2s"),
        (logging.DEBUG, f"{LABEL}: not seen gone 0.2s after SIGTERM {unseen}"),
        (
            logging.WARNING,
            f"{LABEL} not seen gone 0.2s after SIGTERM {unseen}; sending SIGKILL to the tree",
        ),
        (logging.DEBUG, f"{LABEL}: sending SIGKILL to the tree, waiting up to 0.5s"),
        (logging.ERROR, f"{LABEL}: not seen gone 0.5s after SIGKILL {why}"),
    ]


def test_a_tree_killed_by_the_program_that_could_not_be_looked_at_is_not_said_to_run_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_proctree")
    teardown = Teardown(Escalation.graceful(0.2), label=LABEL, stdin_open=False, killed=True)
    assert teardown.start(tree_alive=True) == AwaitEmpty(0.2)
    assert teardown.send(Unseen()) == KillAll()
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL} not seen gone 0.2s into cleanup, after the program's SIGKILL (it could not "
        "be looked at); sending SIGKILL to the tree"
    ]


# --- the policy values -------------------------------------------------------------------


def test_the_default_policy_is_sigterm_5s_then_sigkill_2s() -> None:
    assert Escalation.graceful() == Escalation.graceful(5.0, signal.SIGTERM) == Escalation()
    policy = Escalation()
    assert policy.steps == (Step(signal.SIGTERM, 5.0),)
    assert policy.close_stdin is None
    assert policy.kill_wait == 2.0
    assert policy.worst_case == 7.0
    assert policy.graceful_steps == policy.steps


def test_steps_accept_tuples_and_steps() -> None:
    policy = Escalation(steps=[Step("INT", 1), (signal.SIGTERM, 2)])
    assert policy.steps == (Step(signal.SIGINT, 1.0), Step(signal.SIGTERM, 2.0))
    assert isinstance(policy.steps, tuple)
    assert all(isinstance(step.wait, float) for step in policy.steps)


def test_worst_case_counts_waits_up_to_the_sigkill_step_and_its_own() -> None:
    policy = Escalation(
        steps=[(signal.SIGINT, 1.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 0.25)],
        close_stdin=0.5,
    )
    assert policy.graceful_steps == (Step(signal.SIGINT, 1.0), Step(signal.SIGTERM, 2.0))
    assert policy.worst_case == 0.5 + 1.0 + 2.0 + 0.25


@pytest.mark.parametrize("grace", [0, 0.0005, 5.0])
def test_sigkill_as_stop_signal_has_no_grace_and_the_usual_kill_wait(grace: float) -> None:
    # No grace follows SIGKILL: ``grace`` is not the wait after it (red before, helper-25,
    # with a SIGKILL step's wait made the kill_wait: grace=0 was refused as a kill_wait of
    # 0, and a tiny grace let cleanup give up on processes still dying of SIGKILL).
    policy = Escalation.graceful(grace, signal.SIGKILL)
    assert policy.graceful_steps == ()
    assert policy.kill_wait == Escalation().kill_wait == 2.0
    assert policy.worst_case == 2.0


def test_a_last_sigkill_step_is_the_hard_stop_and_its_wait_the_kill_wait() -> None:
    # Red before (helper-27): its wait was dropped for the default kill_wait, unsaid.
    policy = Escalation(steps=[(signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)])
    assert policy.graceful_steps == (Step(signal.SIGTERM, 1.0),)
    assert policy.kill_wait == 3.0
    assert policy.worst_case == pytest.approx(1.0 + 3.0)
    assert policy == Escalation(steps=[(signal.SIGTERM, 1.0), (signal.SIGKILL, 3.0)], kill_wait=3)


def test_steps_after_a_sigkill_step_are_refused() -> None:
    # They could never run (red before, helper-27: dropped, unsaid).
    with pytest.raises(ValueError, match=r"SIGKILL step .* must be the last step"):
        Escalation(steps=[(signal.SIGTERM, 1.0), (signal.SIGKILL, 9.0), (signal.SIGINT, 9.0)])


def test_a_sigkill_step_and_another_kill_wait_are_refused() -> None:
    with pytest.raises(ValueError, match=r"SIGKILL step's wait \(9s\) is the kill_wait.*\(4s\)"):
        Escalation(steps=[(signal.SIGTERM, 1.0), (signal.SIGKILL, 9.0)], kill_wait=4.0)
    # (The default, 2 s, given is taken for none, as attrs.evolve passes it on.)
    assert Escalation(steps=[(signal.SIGKILL, 9.0)], kill_wait=2.0).kill_wait == 9.0
    with pytest.raises(ValueError, match="SIGKILL takes a moment to land"):
        Escalation(steps=[(signal.SIGTERM, 1.0), (signal.SIGKILL, 0)])


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (10**400, "grace must be a finite number of seconds >= 0, not an integer of 1329 bits"),
        (
            -(10**400),
            "grace must be a finite number of seconds >= 0, not a negative integer of 1329 bits",
        ),
        (-1, "grace must be a finite number of seconds >= 0, not -1"),
        (-1.5, "grace must be a finite number of seconds >= 0, not -1.5"),
        (True, "grace must be a number of seconds, not True"),
    ],
)
def test_a_refused_duration_says_what_was_given(value: object, said: str) -> None:
    # (An int too large for a float is shown by its size: its digits would fill a screen.)
    with pytest.raises(ValueError) as refused:
        parse_duration(value, what="grace")  # type: ignore[arg-type]
    assert str(refused.value) == said


def test_steps_after_a_sigkill_step_are_refused_saying_why() -> None:
    with pytest.raises(ValueError) as refused:
        Escalation(steps=[(signal.SIGKILL, 1.0), (signal.SIGTERM, 1.0)])
    assert str(refused.value) == (
        "a SIGKILL step ends the escalation: it must be the last step (the steps after it "
        "would never run)"
    )


def test_a_policy_evolved_to_end_in_a_sigkill_step_takes_its_wait() -> None:
    # attrs.evolve passes every field on, kill_wait's default too: red before
    # (helper-29), refused as a clash with the SIGKILL step's wait nobody asked for.
    evolved = attrs.evolve(
        Escalation(steps=[(signal.SIGTERM, 5.0)]),
        steps=[(signal.SIGTERM, 5.0), (signal.SIGKILL, 3.0)],
    )
    assert evolved.kill_wait == 3.0
    assert evolved == Escalation(steps=[(signal.SIGTERM, 5.0), (signal.SIGKILL, 3.0)])


def test_policies_are_frozen_values() -> None:
    policy = Escalation.graceful(1.0)
    assert policy == Escalation(steps=[(signal.SIGTERM, 1.0)])
    assert hash(policy) == hash(Escalation(steps=[(signal.SIGTERM, 1.0)]))
    with pytest.raises(AttributeError):
        policy.kill_wait = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (signal.SIGTERM, signal.SIGTERM),
        (15, signal.SIGTERM),
        ("TERM", signal.SIGTERM),
        ("SIGTERM", signal.SIGTERM),
        ("sighup", signal.SIGHUP),
    ],
)
def test_signals_by_number_member_or_name(value: object, expected: int) -> None:
    parsed = parse_signal(value)  # type: ignore[arg-type]
    assert parsed is expected  # the Signals member itself: it prints as its name


def test_a_realtime_signal_stays_a_number() -> None:
    assert parse_signal(signal.SIGRTMIN + 1) == signal.SIGRTMIN + 1


def test_signals_are_named_as_people_know_them() -> None:
    assert signal_name(signal.SIGTERM) == "SIGTERM"
    assert signal_name(signal.SIGRTMIN + 1) == f"signal {signal.SIGRTMIN + 1}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "signal must be a signal, not True"),
        (0, "signal 0 is not a valid signal on this platform"),
        (-3, "signal -3 is not a valid signal on this platform"),
        (1 << 20, "signal 1048576 is not a valid signal on this platform"),
        ("NOPE", "signal 'NOPE' is not a signal name on this platform"),
        (2.5, "signal must be a signal number or name, not 2.5"),
        (None, "signal must be a signal number or name, not None"),
        (b"TERM", "signal must be a signal number or name, not b'TERM'"),
    ],
)
def test_non_signals_are_refused_clearly(value: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_signal(value)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_stop_signals_say_what_they_are_in_errors() -> None:
    with pytest.raises(ValueError) as unknown:
        Step("SIGNOPE", 1)
    assert str(unknown.value) == "stop signal 'SIGNOPE' is not a signal name on this platform"
    with pytest.raises(ValueError) as cannot:
        Step(signal.SIGCONT, 1)
    assert str(cannot.value) == "stop signal SIGCONT cannot stop a process tree; use e.g. SIGTERM"


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.5, 1e6])
def test_durations_accept_finite_non_negative_numbers(value: float) -> None:
    assert parse_duration(value, what="x") == float(value)


@pytest.mark.parametrize("value", [-1, -0.001, float("nan"), float("inf"), True, "1", None])
def test_durations_refuse_the_rest_naming_the_setting(value: object) -> None:
    with pytest.raises(ValueError, match=r"^kill_wait must be"):
        parse_duration(value, what="kill_wait")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"close_stdin": -1}, "close_stdin must be a finite number of seconds >= 0, not -1"),
        # (Said as "> 0" for every value it refuses: ">= 0" for some, as before stop 41,
        # was wrong for 0; helper-75.)
        ({"kill_wait": float("inf")}, "kill_wait must be a finite number of seconds > 0, not inf"),
        ({"kill_wait": -1}, "kill_wait must be a finite number of seconds > 0, not -1"),
        (
            {"kill_wait": 0},
            "kill_wait must be a finite number of seconds > 0, not 0: "
            "SIGKILL takes a moment to land",
        ),
        (
            {"steps": [(signal.SIGTERM, -1)]},
            "step wait must be a finite number of seconds >= 0, not -1",
        ),
        ({"steps": []}, "an Escalation needs at least one (signal, wait) step"),
    ],
)
def test_bad_policies_are_refused_naming_the_setting(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        Escalation(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_bad_grace_is_named_grace() -> None:
    with pytest.raises(ValueError) as caught:
        Escalation.graceful(-1)
    assert str(caught.value) == "grace must be a finite number of seconds >= 0, not -1"


def test_resolve_policy_takes_shortcuts_or_a_policy_never_both() -> None:
    assert resolve_policy(2.0, "INT", None) == Escalation(steps=[(signal.SIGINT, 2.0)])
    custom = Escalation(kill_wait=1.0)
    assert resolve_policy(5.0, signal.SIGTERM, custom) is custom
    with pytest.raises(ValueError) as both:
        resolve_policy(2.0, signal.SIGTERM, custom)
    assert str(both.value) == "pass either escalation= or grace=/stop_signal=, not both"
    with pytest.raises(ValueError, match="either"):
        resolve_policy(5.0, signal.SIGINT, custom)
    with pytest.raises(ValueError, match="Escalation"):
        resolve_policy(5.0, signal.SIGTERM, "fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("returncode", "lost", "caught", "failed"),
    [
        (None, False, False, False),  # not gone yet
        (None, True, False, True),  # reaped elsewhere, its status never seen
        (0, False, False, False),  # exited: it had its chance
        (3, True, False, False),  # a status seen before the loss counts
        (-signal.SIGTERM, False, True, False),  # re-raised the step it handled
        (-signal.SIGTERM, False, False, True),  # died of the step, no handler
        (-signal.SIGSEGV, False, True, True),  # a crash, handler or not
    ],
)
def test_a_leader_fails_its_step_only_by_dying_of_it_unhandled_or_crashing_or_being_lost(
    returncode: int | None, lost: bool, caught: bool, failed: bool
) -> None:
    step = LeaderStep(signal.SIGTERM, caught)
    assert step.failed(returncode, lost=lost) is failed


def test_a_ctrl_c_in_the_middle_of_a_step_turns_the_plan_into_the_hard_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_proctree")
    teardown = Teardown(Escalation.graceful(3.0), label=LABEL, stdin_open=False)
    assert teardown.start(tree_alive=True) == SendSignal(signal.SIGTERM)
    assert teardown.interrupted() == KillAll()  # (the signal's wait skipped)
    assert teardown.send(None) == AwaitEmpty(2.0, grace=False)
    assert teardown.send(True) == Finished(emptied=True)
    assert teardown.signals == [signal.SIGTERM, signal.SIGCONT, signal.SIGKILL]
    assert not teardown.grace_expired
    assert [r.getMessage() for r in caplog.records] == [
        f"{LABEL}: cleanup interrupted (Ctrl-C) in the middle of a step; sending SIGKILL to "
        "the tree"
    ]
