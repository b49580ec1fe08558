from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import trio

from . import procs


class Tracked:
    """Environment for the trees a test starts, and what of them is still alive."""

    def __init__(self) -> None:
        self.token = procs.new_token()
        self.env = {**os.environ, procs.TOKEN_VAR: self.token}

    def survivors(self) -> list[int]:
        return procs.survivors(self.token)


@pytest.fixture
def tracked() -> Iterator[Tracked]:
    """Every test that starts processes uses this env; after the test nothing may carry it."""
    tracker = Tracked()
    yield tracker
    leaked = procs.kill_survivors(tracker.token)
    assert not leaked, f"processes outlived the test (killed now): {leaked}"


async def read_pids(stream: trio.abc.ReceiveStream, count: int) -> list[int]:
    """Read ``count`` pids, one per line, that a test shell echoes as it starts members."""
    buffer = b""
    while buffer.count(b"\n") < count:
        chunk = await stream.receive_some()
        assert chunk, f"stream ended after {buffer!r}"
        buffer += chunk
    return [int(line) for line in buffer.split(b"\n")[:count]]
