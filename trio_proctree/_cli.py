"""The ``trio-proctree`` command line (also ``python -m trio_proctree``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import re
import signal
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

import trio

from . import __version__
from ._choose import CONTAINMENTS
from ._cmd_orphans import run as list_orphans
from ._cmd_run import RunOptions, children_reaped_by_us, end_by
from ._cmd_run import run as run_command
from ._demo import Interrupted, compare, render
from ._escalation import parse_duration, parse_stop_signal
from ._procfs import foreign_proc
from ._said import REPORT_LOST, ReportLost, complain, drop_said, flush_said, say, say_on_stderr

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

#: Duration suffixes, as timeout(1) reads them.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _number(text: str) -> float:
    """The number of seconds ``text`` says, suffix and all; its sign and size unchecked."""
    number, scale = (text[:-1], _UNITS[text[-1]]) if text[-1:] in _UNITS else (text, 1)
    try:
        return float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a duration (a number of seconds, or of minutes, hours or days "
            "with a suffix s, m, h or d)"
        ) from None


def _seconds(text: str) -> float:
    """A number of seconds, or of minutes, hours or days with a suffix (``0.5s``, ``10m``)."""
    try:
        return parse_duration(_number(text), what="a duration")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _timeout(text: str) -> float | None:
    """``--timeout``: a duration, where 0 or ``inf`` means none, as timeout(1) reads it (so
    that a script's ``--timeout "${LIMIT:-0}"``, or ``:-inf}``, works)."""
    if _number(text) == math.inf:
        return None
    return _seconds(text) or None


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {pid} (must be 1 or more)")
    return pid


def _signal(text: str) -> int:
    try:
        return parse_stop_signal(int(text) if text.isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """argparse's parser, saying what it says as the tool says the rest: help and version
    are reports (`say`: a reader that left ends the tool as by SIGPIPE, a full disk or a
    closed stdout exits `REPORT_LOST` saying so), usage errors are complaints
    (`say_on_stderr`). argparse drops its own write errors (3.11 on: status 0 with the
    help lost) or raises them (3.10: a traceback, status 1), and with stderr closed prints
    the usage on stdout, where a pipeline would read it as the tool's output."""

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        if file is None:
            say(self.format_help())
        else:
            super().print_help(file)

    def print_usage(self, file: SupportsWrite[str] | None = None) -> None:
        if file is None:
            say(self.format_usage())
        else:
            super().print_usage(file)

    def error(self, message: str) -> NoReturn:
        say_on_stderr(self.format_usage())
        self.exit(2, f"{self.prog}: error: {message}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            say_on_stderr(message)
        sys.exit(status)


class _Version(argparse.Action):
    """``--version``: a report, as `_Parser` says help (argparse's own writes it with
    argparse's own error handling)."""

    def __call__(
        self, parser: argparse.ArgumentParser, *args: object, **kwargs: object
    ) -> NoReturn:
        say(f"{parser.prog} {__version__}\n")
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trio-proctree",
        description=(
            "Run and inspect subprocess trees: the command and everything it starts, "
            "daemons and setsid escapees included."
        ),
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="show the version number and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    commands.add_parser(
        "demo",
        help="compare, live, what each way of cancelling a subprocess leaves running",
        description=(
            'Runs sh -c "sleep 60 & sleep 61 & wait" under five strategies (no cleanup, '
            "killing the leader, trio.run_process, killpg, trio_proctree), then a tree with "
            "a setsid daemon under killpg and trio_proctree; cancels each once its "
            "processes run, and prints how many survived and how long the teardown took. "
            "Everything it starts is killed before it exits."
        ),
    )

    run = commands.add_parser(
        "run",
        # (Its usage errors found after parsing show its own usage: `main`.)
        help="run a command as a contained tree, with an optional time limit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
            Run CMD as a contained process tree: when it ends, times out, or this command
            gets SIGTERM, SIGINT or SIGHUP, whatever CMD started that is still running is
            stopped: the stop signal to every process, SIGCONT, up to --grace seconds,
            then SIGKILL and up to 2 s for it to land (so at most --grace + 2 seconds;
            where something outlives SIGKILL, frozen or stuck in the kernel, it says so,
            and its exit, status 125, waits up to ~2.5 s more for the parent-death
            backstop to try too). A tree-aware timeout(1): coreutils timeout signals
            its own process group and misses daemons and setsid escapees.

            stdin, stdout and stderr are CMD's own. Typed at a shell, CMD gets the
            terminal, even with stdin redirected; run by a script, a program or in a
            pipeline, it gets it when it reads it, and Ctrl-C stays the caller's. Ctrl-Z,
            fg and bg work on CMD as on any job.
            """
        ),
        epilog=textwrap.dedent(
            """\
            exit status:
              CMD's own; 128+N if signal N ended it; after a SIGTERM,
              SIGINT or SIGHUP to this tool, it ends by that signal (one
              during a stop already under way kills the tree at once), as
              it does when CMD had the terminal and died of a Ctrl-C
              124  --timeout expired (as timeout(1))
              125  trio-proctree itself failed, or could not make sure the tree is gone
              126  CMD is not executable
              127  CMD was not found
              2    usage error

            examples:
              trio-proctree run --timeout 600 -- make -j8 test
              trio-proctree run --grace 10 --signal INT -- ./server --port 8080
            """
        ),
    )
    run.add_argument(
        "--grace",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="seconds between the stop signal and SIGKILL, or with a suffix s, m, h or d "
        "(default: 5)",
    )
    run.add_argument(
        "--signal",
        type=_signal,
        default=15,
        metavar="NAME",
        help="the stop signal: TERM, INT, HUP, ... or a number (default: TERM)",
    )
    run.add_argument(
        "--timeout",
        type=_timeout,
        default=None,
        metavar="S",
        help="stop the tree after S seconds (suffixes s, m, h, d, as timeout(1) takes) "
        "and exit with 124 (default, or 0 or inf: none)",
    )
    run.add_argument(
        "--containment",
        choices=CONTAINMENTS,
        default="auto",
        help="how to hold the tree together (default: auto, the strongest here)",
    )
    run.set_defaults(parser=run)
    run.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the command to run"
    )

    orphans = commands.add_parser(
        "orphans",
        help="list processes that outlived what started them (exit 1 if any)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
            List processes adopted by init (PID 1 of this PID namespace: the container
            init, in a container) or by a child subreaper: processes whose parent died,
            which is how escaping process trees show up. Listed: every child of PID 1
            and of each --reaper; and children of this command's ancestors whose process
            group or session leader has exited. PID 1's own services are listed too: use
            --match to look for what you care about.

            Exit status 1 when any is found, 0 when none: usable as a monitoring check;
            2 when it cannot look (bad usage, a --reaper that does not exist, or a /proc
            of another PID namespace).
            """
        ),
        epilog=textwrap.dedent(
            """\
            examples:
              trio-proctree orphans --match 'chrome|chromedriver'
              trio-proctree orphans --json --match node
            """
        ),
    )
    orphans.set_defaults(parser=orphans)
    orphans.add_argument(
        "--match", metavar="REGEX", help="only processes whose command line matches REGEX"
    )
    orphans.add_argument("--json", action="store_true", help="print a JSON list")
    orphans.add_argument(
        "--reaper",
        type=_pid,
        action="append",
        default=[],
        metavar="PID",
        help="also list every child of this subreaper (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            status = _main(argv)
        except SystemExit:  # (a usage error, said on stderr)
            flush_said()
            raise
        except ReportLost as lost:
            complain(f"could not write its report: {lost}")
            status = REPORT_LOST
        # Flushed here, not at exit, where a reader that left would make the status 120.
        flush_said()
        return status
    except BrokenPipeError:
        # A reader that left early (`trio-proctree demo | head -1`): the end a tool killed
        # by SIGPIPE has, not a traceback (helper-61). Its output goes nowhere from here,
        # or Python's flush at exit would fail on it once more (stdout's or stderr's: the
        # one that broke is not told; either may be closed, or None: helper-62).
        for stream in (sys.stdout, sys.stderr):
            drop_said(stream)
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("demo", "orphans") and (foreign := foreign_proc()) is not None:
        # Both count or list processes by what /proc says: there, other processes than
        # the numbers name here (and the demo would start its uncontained trees first).
        parser.exit(2, f"trio-proctree {args.command}: {foreign}\n")
    if args.command == "demo":
        children_reaped_by_us()
        try:
            rows = trio.run(compare)
        except Interrupted as stopped:
            # (Unsaid where stderr is full or closed: raised, the write made the status 1.
            # Nor to a reader that left: a Ctrl-C that ended `head` too ends us as well.)
            with contextlib.suppress(BrokenPipeError):
                complain("demo interrupted; nothing it started still runs")
            # Ended by the signal, as an uncaught one would have ended it: a shell loop
            # running the demo stops at a Ctrl-C only if its command died of SIGINT.
            return end_by(stopped.signal)
        report = io.StringIO()
        render(rows, report)
        say(report.getvalue())
        return 0
    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            args.parser.error("no command given (trio-proctree run [OPTIONS] -- CMD [ARGS...])")
        options = RunOptions(command, args.grace, args.signal, args.timeout, args.containment)
        return run_command(options)
    try:
        re.compile(args.match or "")
    except re.error as exc:
        # orphans' own usage, as run's errors show run's (helper-61: the top-level one).
        args.parser.error(f"--match is not a valid regular expression: {exc}")
    return list_orphans(args.match, args.json, args.reaper)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
