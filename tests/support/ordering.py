"""The slowest test modules run first, so that a parallel run (``make test``: xdist) does not
end waiting on one of them started last.

xdist hands out the collected tests round-robin, in collection order; these modules hold
the longest tests (tens of seconds each: whole training runs, fuzzing, killed writers over
S3, spawned workers), so moving them to the front spreads them over the workers while the
many short tests fill in behind. Only the order changes: every test still runs, and within
a module the order stays the collection order. Longest single test first (measured with
``--durations`` on ``make test``).
"""

from __future__ import annotations

import pytest

__all__ = ["SLOWEST_FIRST"]

SLOWEST_FIRST = (
    "reliability/test_hostile_metadata.py",
    "integrations/test_lightning.py",
    "integrations/test_transformers.py",
    "integrations/test_torchrun.py",
    "ingest/test_kill_points.py",
    "examples/test_train_tiny_gpt.py",
    "loader/test_persistent_workers.py",
    "loader/test_start_methods.py",
    "loader/test_worker_imports.py",
    "storage/test_document_storage.py",
    "integrations/test_distributed_env.py",
    "loader/test_worker_exit.py",
    "storage/test_commit.py",
    "cache/test_epochs.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.path.as_posix()
    for rank, module in enumerate(SLOWEST_FIRST):
        if path.endswith("tests/" + module):
            return rank
    return len(SLOWEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: each module's own order is kept
