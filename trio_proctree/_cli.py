"""The ``trio-proctree`` command line (also ``python -m trio_proctree``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import trio

from . import __version__
from ._demo import compare, render


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-proctree",
        description="Tie the lifetime of a whole subprocess tree to a trio scope.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser(
        "demo",
        help="compare, live, what each way of cancelling a subprocess leaves running",
        description=(
            'Runs sh -c "sleep 60 & sleep 61 & wait" under five strategies (no cleanup, '
            "killing the leader, trio.run_process, killpg, trio_proctree), cancels each "
            "once its three processes run, and prints how many survived and how long the "
            "teardown took. Everything it starts is killed before it exits."
        ),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "demo":  # pragma: no branch - the only command so far
        rows = trio.run(compare)
        render(rows, sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
