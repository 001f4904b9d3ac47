"""The adapter interface every measured system implements.

The harness owns timing, counting and verification; a system only knows how to lay out the
generated data in its own format (:meth:`System.prepare`), open it at a location
(:meth:`System.open`) and read windows (:meth:`System.read`, :meth:`System.fetch`). Keeping
the clock out of the adapters is what makes the figures comparable: every system is timed by
the same loop (``benchmarks.measure``), on the same windows, with the same counters.

A system runs in a worker subprocess (``benchmarks.worker``), one per system and location,
so a crash, a hang or a leaked thread pool of one system cannot touch another's figures.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from benchmarks.config import RunConfig
from benchmarks.s3env import S3Endpoint
from benchmarks.workloads import DatasetData, Payload, WindowSet, ground_truth


@dataclass(frozen=True)
class Location:
    """Where a system reads its prepared data from.

    ``local_dir`` always holds the system's prepared files (written by ``prepare``). For
    ``kind == "s3"`` the same files were uploaded unchanged to ``s3_url`` and ``endpoint``
    says how to reach them (through the latency proxy unless the system's support says
    otherwise). ``cache_dir`` is an empty directory the system may use for caches; its size
    after the workload is reported as local disk used.
    """

    kind: str  # "local" | "s3"
    local_dir: Path
    cache_dir: Path
    s3_url: str | None = None
    endpoint: S3Endpoint | None = None

    @property
    def bucket_key(self) -> tuple[str, str]:
        """(bucket, key prefix) of ``s3_url``."""
        assert self.s3_url is not None
        rest = self.s3_url.removeprefix("s3://")
        bucket, _, prefix = rest.partition("/")
        return bucket, prefix


@dataclass(frozen=True)
class Support:
    """How a system takes part in one workload at one location.

    ``concurrency`` lists the levels it runs at (windows in flight; a sync-only reader runs
    at 1). ``exact`` says whether it returns exactly the workload's windows; when it does the
    closest equivalent job instead (aligned blocks, whole records sliced after download),
    ``note`` says what it does, and the report prints it beside the figures.
    ``own_concurrency`` marks a system that decides itself how many requests are in flight
    (a DataLoader's prefetching workers): the S3 ceiling replays its GETs at the peak the
    proxy saw in flight rather than at ``concurrency`` windows' worth. ``any_order`` marks
    a system that returns the windows in an order of its own (a shuffled loader): the check
    finds each returned window in the source instead of comparing window ``i``; only such
    systems run the loader workloads (``config.LOADER_WORKLOADS``).
    """

    concurrency: tuple[int, ...] = (1,)
    exact: bool = True
    note: str = ""
    own_concurrency: bool = False
    any_order: bool = False


class Unavailable(Exception):
    """Raised by a system that cannot run here (missing package); the table says why."""


class System(ABC):
    """One measured system. Subclasses are instantiated once per worker subprocess."""

    #: registry key, e.g. ``"litdata-window"``
    name: ClassVar[str]
    #: legend label
    label: ClassVar[str]
    #: systems of one family share prepared data (``.work/prepared/<tag>/<family>/<dataset>``)
    family: ClassVar[str]
    #: the workload being measured, set by the harness before :meth:`open`
    workload: str = ""

    def check_available(self) -> None:  # noqa: B027  (optional hook, default: available)
        """Raise :class:`Unavailable` with a reason if this system cannot run here."""

    @abstractmethod
    def supports(self, workload: str, location: str) -> Support | None:
        """How this system runs ``workload`` at ``location`` ("local"/"s3"); None: it doesn't."""

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:  # noqa: B027
        """Write ``data`` in this system's format into ``out_dir`` (empty, created).

        Called once per family and dataset and cached between runs; the harness uploads
        ``out_dir`` unchanged for S3 runs. The default writes nothing (raw readers use the
        generated files directly).
        """

    @abstractmethod
    def open(self, data: DatasetData, location: Location) -> None:
        """Open the prepared dataset cold; timed together with the first window."""

    @abstractmethod
    def fetch(self, windows: WindowSet, i: int) -> Payload:
        """Return window ``i`` (checked against :meth:`truth` for the first windows)."""

    @abstractmethod
    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        """Read windows ``ids`` with up to ``concurrency`` in flight; return payload bytes.

        The returned byte count must come from the arrays actually returned (their
        ``nbytes``), so a reader that silently returns less is visible in the report.
        """

    def truth(self, data: DatasetData, windows: WindowSet, i: int) -> Payload:
        """What :meth:`fetch` must return for window ``i``; override for equivalent jobs."""
        return ground_truth(data, windows, i)

    def io_counters(self) -> dict[str, float] | None:
        """Cumulative ``requests`` and ``response_bytes`` the system itself counted, or None.

        Used where no proxy counts the traffic (local disk), by systems whose library reports
        its own reads; must be cheap, it is called around every repeat.
        """
        return None

    def later_epoch_first_batches(self) -> list[float]:
        """Seconds from ``iter(loader)`` to the first batch of every epoch after the first
        that the workload's repeats ran through (loaders iterated across repeats); empty for
        systems without epochs."""
        return []

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release clients, pools and files; called after each workload."""


async def run_lanes(
    ids: Iterable[int], concurrency: int, one: Callable[[int], Awaitable[int]]
) -> int:
    """Run ``one(i)`` for every id with ``concurrency`` in flight; return the sum of results.

    Each lane takes the next id as soon as its previous one finished (no batch barriers),
    which is how a training loop keeps a fixed number of windows in flight.
    """
    todo = iter(ids)
    totals: list[int] = []

    async def lane() -> None:
        for i in todo:  # shared iterator: lanes never read the same window
            n = await one(i)  # (not ``total += await``: the read would precede the await)
            totals.append(n)

    await asyncio.gather(*(lane() for _ in range(max(1, concurrency))))
    return sum(totals)


def read_temporal_windows(
    read_window: Callable[[int, int, int, list[str]], dict[str, np.ndarray]],
    windows: WindowSet,
    ids: np.ndarray,
) -> int:
    """Read temporal windows ``ids`` one ``read_window`` call at a time; return their bytes.

    The per-window loop of every library's sync temporal read, as lean as raw-memmap's own
    (arguments converted for all windows at once, not per window), so the ratios against
    memmap measure the libraries, not the harness around their calls.
    """
    assert windows.records is not None and windows.starts is not None
    frames, fields = windows.frames, list(windows.fields)
    total = 0
    records, starts = windows.records[ids].tolist(), windows.starts[ids].tolist()
    for record, start in zip(records, starts, strict=True):
        for array in read_window(record, start, frames, fields).values():
            total += array.nbytes
    return total


def payload_nbytes(payload: Payload) -> int:
    """Bytes of a payload as returned to the caller."""
    if isinstance(payload, dict):
        return sum(int(v.nbytes) for v in payload.values())
    if isinstance(payload, list):
        return sum(len(x) for x in payload)
    return int(payload.nbytes)
