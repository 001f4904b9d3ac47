"""Named steps of the commit protocol where a test may kill the process: a test hook.

Every step of a write that leaves the store in a distinct state calls ``kill_point(name)``.
When the environment variable ``RANGESTREAM_KILL_AT`` names that step, the process kills
itself there with ``SIGKILL`` (no clean-up, no ``finally``, as a lost machine or the OOM
killer would), so tests can check that every later command copes with exactly that state.
Unset (always, outside tests), a kill point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["ENVIRONMENT", "POINTS", "kill_point"]

#: The environment variable naming the step to die at.
ENVIRONMENT = "RANGESTREAM_KILL_AT"

#: The steps, in the order a ``convert`` or ``write`` passes them.
POINTS = (
    # the session file is written, nothing else yet
    "session-started",
    # a writer uploaded its data but not its part manifest
    "data-written",
    # a writer's part manifest is written (its split is complete)
    "part-written",
    # every split is written; the commit has not started
    "splits-written",
    # the commit wrote the index and group documents; the root is not published
    "index-written",
    # the root names the new version; the version before the previous one is not deleted
    "root-published",
    # the commit is complete; the session file still names it
    "committed",
)


def kill_point(name: str) -> None:
    """Die here, at once, if ``RANGESTREAM_KILL_AT`` names this step (a test hook)."""
    if os.environ.get(ENVIRONMENT) != name:
        return
    kill = getattr(signal, "SIGKILL", None)
    if kill is None:  # no SIGKILL (Windows): the nearest thing, an exit without clean-up
        os._exit(137)
    os.kill(os.getpid(), kill)
