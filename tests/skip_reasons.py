"""A pytest plugin for this suite: a skip inside a trio test is reported with its reason."""

from __future__ import annotations

import sys
from collections.abc import Generator

import pytest
from _pytest.outcomes import Skipped

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


def _the_one_skip_in(group: BaseException | None) -> Skipped | None:
    """The single skip a test raised inside trio.run, if ``group`` holds only that."""
    leaves: list[BaseException] = []
    queue = [group] if isinstance(group, BaseExceptionGroup) else []
    while queue:
        for exc in queue.pop().exceptions:
            if isinstance(exc, BaseExceptionGroup):
                queue.append(exc)
            else:
                leaves.append(exc)
    if len(leaves) == 1 and isinstance(leaves[0], Skipped):
        return leaves[0]
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # pytest-trio 0.8 turns the group trio.run raises around a test's skip into a bare
    # pytest.skip(): the reason and the test's line are lost, and a test that skips
    # because it could not arrange its race reads like any other. Raise the test's own
    # skip instead; its traceback still ends at the line that skipped.
    try:
        return (yield)
    except Skipped as bare:
        own = _the_one_skip_in(bare.__context__)
        if bare.msg or own is None:
            raise
        raise own from None
