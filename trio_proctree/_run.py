"""What run_process_tree does the same way in both drivers: its arguments and its result;
and what both drivers say of an output pipe they close."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

import attrs

logger = logging.getLogger("trio_proctree")

#: After the tree is gone, how long `run_process_tree` keeps reading output pipes that
#: something outside the tree still holds open (bounded, like Go's ``Cmd.WaitDelay``).
PIPE_DRAIN_TIMEOUT = 1.0


class HasFileno(Protocol):
    """A file-like ``stdin`` for `run_process_tree`: what it has of the file is its number."""

    def fileno(self) -> int: ...


@attrs.frozen
class RunRequest:
    #: Options for open_process_tree, with stdin/stdout/stderr filled in.
    options: dict[str, Any]
    #: Bytes to write to stdin, then close it; None when stdin is not ours to feed.
    feed: bytes | None
    #: The streams to collect: a subset of ("stdout", "stderr").
    capture: tuple[str, ...]


def plan_run(
    stdin: object,
    capture_stdout: bool,
    capture_stderr: bool,
    options: Mapping[str, Any],
    *,
    hands_back_streams: bool,
    hand_back: str,
) -> RunRequest:
    """Check run_process_tree's arguments (as `trio.run_process` does).

    ``hand_back``: the driver's way to hand the tree back (trio's ``nursery.start()``),
    which an output pipe asked for without it is of use with.
    """
    if isinstance(stdin, str):
        raise TypeError("stdin must be bytes, not str")
    options = dict(options)
    if not hands_back_streams:
        for name, value in (
            ("stdin", stdin),
            ("stdout", options.get("stdout")),
            ("stderr", options.get("stderr")),
        ):
            if value is subprocess.PIPE:
                raise ValueError(
                    f"{name}=subprocess.PIPE is only useful when the tree is handed back "
                    f"({hand_back}); for streams of your own, use open_process_tree"
                )
    feed = None
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        feed = bytes(cast("bytes", stdin))
        options["stdin"] = subprocess.PIPE
    else:
        options["stdin"] = stdin
    capture: list[str] = []
    for wanted, name in ((capture_stdout, "stdout"), (capture_stderr, "stderr")):
        if wanted:
            if name in options:
                raise ValueError(f"can't specify both {name}= and capture_{name}=True")
            options[name] = subprocess.PIPE
            capture.append(name)
    return RunRequest(options, feed, tuple(capture))


def completed(
    args: Any,
    returncode: int | None,
    outputs: Mapping[str, Sequence[bytes]],
    request: RunRequest,
    *,
    check: bool,
) -> subprocess.CompletedProcess[bytes]:
    """The result of a run, or `subprocess.CalledProcessError` when checked and non-zero."""
    assert returncode is not None, "cleanup reaped the leader"
    stdout = b"".join(outputs["stdout"]) if "stdout" in request.capture else None
    stderr = b"".join(outputs["stderr"]) if "stderr" in request.capture else None
    if check and returncode != 0:
        raise subprocess.CalledProcessError(returncode, args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(args, returncode, stdout, stderr)


#: The most either driver reads from an output pipe as cleanup closes it, and, while the
#: tree stops, the most it holds read and not yet taken (1 MiB).
DRAIN_AT_MOST = 1 << 20


def dropped(taken: int) -> None:
    """Say that what is left in an output pipe as cleanup closes it, past the ``taken``
    bytes it read then, is dropped (by both drivers)."""
    logger.warning(
        "an output pipe still held data after %d bytes were read from it as its tree "
        "ended (from a writer outside the tree, or written faster than it was read): "
        "the rest is dropped",
        taken,
    )
