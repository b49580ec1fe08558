"""The test suite's own harness: what it adds to pytest so a test's outcome says why."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_skip_inside_a_trio_test_keeps_its_reason(pytester: pytest.Pytester) -> None:
    # Red before: pytest-trio 0.8 re-raised a skip from inside trio.run as a bare
    # pytest.skip(), so -rs said "Skipped" at a line of pytest's own, and a pid-reuse test
    # that could not arrange its race was indistinguishable from any other skip.
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest("pytest_plugins = ['tests.skip_reasons']\n")
    pytester.makepyfile(
        test_skipping="""
        import pytest

        async def test_gives_up():
            pytest.skip("could not arrange the race")
        """
    )
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skipping.py:4: could not arrange the race"])
