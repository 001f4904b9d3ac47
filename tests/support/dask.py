"""A real ``dask.distributed`` cluster of worker processes on loopback, one per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["dask_client"]


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A client of a LocalCluster: 2 worker processes (one thread each) behind nannies, so
    a killed worker is restarted and its task retried, as on a real cluster.

    Per module, not per session: the workers are children of the test process, and later
    tests (the loader's) check that no child process is left running.
    """
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client
