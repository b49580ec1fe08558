"""Tie the lifetime of a subprocess tree (the child and all it starts) to a trio scope."""

from ._choose import ContainmentUnavailable
from ._containment import ContainmentLost
from ._escalation import Escalation, Step
from ._outcome import CleanupError, CleanupOutcome
from ._run import PIPE_DRAIN_TIMEOUT
from ._trio import ProcessTree, open_process_tree, run_process_tree

__all__ = [
    "PIPE_DRAIN_TIMEOUT",
    "CleanupError",
    "CleanupOutcome",
    "ContainmentLost",
    "ContainmentUnavailable",
    "Escalation",
    "ProcessTree",
    "Step",
    "open_process_tree",
    "run_process_tree",
]
__version__ = "0.1.0"
