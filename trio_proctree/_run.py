"""What run_process_tree does the same way in both drivers: its arguments and its result;
and what both drivers say of an output pipe they close."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import attrs

logger = logging.getLogger("trio_proctree")

#: After the tree is gone, how long `run_process_tree` keeps reading output pipes that
#: something outside the tree still holds open (bounded, like Go's ``Cmd.WaitDelay``).
PIPE_DRAIN_TIMEOUT = 1.0


class HasFileno(Protocol):
    """A file-like ``stdin`` for `run_process_tree`: what it has of the file is its number."""

    def fileno(self) -> int: ...


_T_contra = TypeVar("_T_contra", contravariant=True)


class TaskStatus(Protocol[_T_contra]):
    """Where `run_process_tree` hands its tree back as soon as the leader runs: the
    ``task_status`` anyio's ``task_group.start()`` passes, or any object with a
    ``started()`` (asyncio has no nursery to start in)."""

    def started(self, value: _T_contra, /) -> None: ...


class _Ignored:
    def started(self, value: object, /) -> None:
        pass

    def __repr__(self) -> str:
        return "TASK_STATUS_IGNORED"


#: The asyncio `run_process_tree`'s default ``task_status``: the tree is handed back to no
#: one.
TASK_STATUS_IGNORED: TaskStatus[Any] = _Ignored()


def hands_back(task_status: object) -> bool:
    """Whether ``task_status`` hands a run's tree back to someone: not when it is trio's,
    anyio's or ours ``TASK_STATUS_IGNORED``, whichever driver is given it (a function of
    the program's own, started with ``start_soon``, passes on the one it was given).
    `TypeError` for one with no ``started()``, before anything is spawned."""
    if not callable(getattr(task_status, "started", None)):
        raise TypeError(
            f"task_status must have a started() method, as the one a nursery's or task "
            f"group's start() passes; got {task_status!r}"
        )
    ignored = [TASK_STATUS_IGNORED]
    for library in ("trio", "anyio"):  # (one not imported has handed none out)
        if (module := sys.modules.get(library)) is not None:
            ignored.append(getattr(module, "TASK_STATUS_IGNORED", TASK_STATUS_IGNORED))
    return not any(task_status is each for each in ignored)


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
    task_status: object,
    hand_back: str,
) -> RunRequest:
    """Check run_process_tree's arguments (as `trio.run_process` does).

    ``hand_back``: the driver's way to hand the tree back (trio's ``nursery.start()``),
    which an output pipe asked for without it is of use with.
    """
    if isinstance(stdin, str):
        raise TypeError("stdin must be bytes, not str")
    options = dict(options)
    if not hands_back(task_status):
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
