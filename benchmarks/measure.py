"""The one timing loop every system is measured with, and what it records.

One loop for all systems is the point: windows/s, CPU per window and the proxy's request and
byte counts are taken at the same places for everyone, so a ratio between two rows compares
the systems and not two ways of measuring them.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.config import Budget
from benchmarks.workloads import TokensData, WindowSet, in_token_stream, payload_equal


@dataclass
class RepeatSample:
    """One timed repeat at one concurrency."""

    windows: int
    seconds: float
    cpu_s: float
    requests: int
    response_bytes: int
    payload_bytes_expected: int
    payload_bytes_returned: int

    @property
    def rate(self) -> float:
        return self.windows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Measurement:
    """Figures of one system, workload, location and concurrency (medians over repeats)."""

    concurrency: int
    windows_per_s: float
    windows_per_s_min: float
    windows_per_s_max: float
    cpu_us_per_window: float
    requests_per_window: float | None
    bytes_per_payload_byte: float | None
    payload_mismatch: bool
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: the proxy's request log of the warm-up and each repeat (S3 rows), for the ceiling's
    #: replay; a file in the run's work directory
    get_log: str | None = None
    #: most requests the proxy saw in flight at once during the timed repeats (S3 rows)
    peak_in_flight: int | None = None
    #: requests in flight on average over the timed repeats (S3 rows)
    mean_in_flight: float | None = None


@dataclass
class WorkloadResult:
    """Everything measured for one system on one workload at one location."""

    system: str
    label: str
    workload: str
    location: str
    note: str = ""
    exact: bool = True
    own_concurrency: bool = False  # a loader: it decides how many requests are in flight
    status: str = "ok"  # ok | unsupported | unavailable | error | timeout
    error: str = ""
    verified: bool | None = None
    ttfw_s: float | None = None
    process_prime_s: float | None = None  # one-time init paid before the cold opens (see worker)
    open_requests: int | None = None
    peak_rss_mb: float | None = None
    disk_mb: float | None = None
    measurements: list[Measurement] = field(default_factory=list)
    #: loaders iterated across repeats: seconds from ``iter(loader)`` to the first batch of
    #: each epoch after the first (``System.later_epoch_first_batches``)
    later_epoch_first_batch_s: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WorkloadResult:
        d = dict(d)
        d["measurements"] = [Measurement(**m) for m in d.get("measurements", [])]
        return cls(**d)


# --------------------------------------------------------------------------- probes


def _children_pids() -> list[int]:
    pids: list[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            pids.extend(kids)
            todo.extend(kids)
    return pids


def cpu_seconds() -> float:
    """CPU of this process, its live descendants (DataLoader workers) and reaped children.

    ``time.process_time`` alone misses worker processes, which is where a DataLoader spends
    its CPU; on a 2-core box shared with the S3 server that CPU is part of the cost.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in _children_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            total += (int(parts[11]) + int(parts[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + ru.ru_utime + ru.ru_stime


def reset_peak_rss() -> None:
    """Reset this process's RSS high-water mark (Linux >= 4.0), so each workload has its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """Peak RSS of this process since the last reset, plus live descendants' peaks."""
    total_kb = 0
    for pid in [os.getpid(), *_children_pids()]:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


def dir_mb(path: Path) -> float:
    """Bytes on disk under ``path`` (allocated blocks, so sparse files count as they are)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total / 2**20


# --------------------------------------------------------------------------- loop

Stats = Callable[[], dict[str, float]]
Reader = Callable[[np.ndarray, int], int]


class Recorder(Protocol):
    """Cuts a request log into phases at the loop's boundaries (``s3env.ProxyRecorder``)."""

    def restart(self) -> None: ...

    def cut(self, windows: int, seconds: float) -> None: ...


class Cursor:
    """Walks the window list; successive repeats read fresh windows, wrapping at the end."""

    def __init__(self, count: int, start: int = 0) -> None:
        self.count = count
        self.pos = start % count

    def take(self, n: int) -> np.ndarray:
        ids = (self.pos + np.arange(n, dtype=np.int64)) % self.count
        self.pos = int((self.pos + n) % self.count)
        return ids


#: Windows per lane in one read call at the least (with more than one lane): see
#: ``timed_repeats``.
LANE_WINDOWS = 8


def timed_repeats(
    read: Reader,
    windows: WindowSet,
    cursor: Cursor,
    concurrency: int,
    budget: Budget,
    stats: Stats | None,
    recorder: Recorder | None = None,
) -> Measurement:
    """Warm up, then run ``budget.repeats`` repeats of about ``repeat_seconds`` each.

    Each repeat calls ``read`` on consecutive chunks of window ids until its time is up. The
    chunk size adapts (doubling while a call takes under 1/20 of the repeat) so that fast
    readers are not dominated by call overhead and slow ones still stop on time; a chunk is
    never smaller than ``concurrency`` so that the requested concurrency can be reached, and
    with ``concurrency > 1`` it starts at ``LANE_WINDOWS`` windows per lane: a call ends
    on its slowest window (its lanes drain), a barrier the S3 ceiling's replay of the same
    GETs (``c`` lanes through the whole repeat) does not have. Over S3 at +20 ms a call of
    ``c`` windows never takes less than the doubling target, so the chunk stayed at ``c``
    and every call was one round of ``c`` GETs waiting for its slowest: the async token
    reader at 64 in flight kept 30 GETs in flight on average and read at 0.79x of its
    replay; in calls of 8 windows per lane, 41 and 0.98x (same reader, 5 repeats each).
    With a ``recorder``, the requests of the warm-up and of each repeat are cut into one
    phase each (outside the timed part), in that order.
    """
    chunk = concurrency * LANE_WINDOWS if concurrency > 1 else 1
    target = budget.repeat_seconds / 20

    def run_for(seconds: float, cap: int) -> RepeatSample:
        nonlocal chunk
        s0 = stats() if stats else None
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        n = expected = returned = 0
        while True:
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds or n >= cap:
                break
            ids = cursor.take(min(chunk, cap - n))
            t1 = time.perf_counter()
            returned += read(ids, concurrency)
            if time.perf_counter() - t1 < target and chunk < 1 << 16:
                chunk *= 2
            n += len(ids)
            expected += int(windows.payload_bytes[ids].sum())
        seconds_used = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
        s1 = stats() if stats else None
        if recorder is not None:
            recorder.cut(n, seconds_used)
        return RepeatSample(
            windows=n,
            seconds=seconds_used,
            cpu_s=cpu,
            requests=int(s1["requests"] - s0["requests"]) if s0 and s1 else -1,
            response_bytes=(int(s1["response_bytes"] - s0["response_bytes"]) if s0 and s1 else -1),
            payload_bytes_expected=expected,
            payload_bytes_returned=returned,
        )

    if recorder is not None:
        recorder.restart()  # the open and the checks are not part of the measured sequence
    run_for(budget.warmup_seconds, budget.max_windows_per_repeat)
    samples = [
        run_for(budget.repeat_seconds, budget.max_windows_per_repeat) for _ in range(budget.repeats)
    ]
    rates = [s.rate for s in samples]
    windows_total = sum(s.windows for s in samples)
    payload_total = sum(s.payload_bytes_expected for s in samples)
    with_stats = stats is not None
    return Measurement(
        concurrency=concurrency,
        windows_per_s=statistics.median(rates),
        windows_per_s_min=min(rates),
        windows_per_s_max=max(rates),
        cpu_us_per_window=sum(s.cpu_s for s in samples) / max(windows_total, 1) * 1e6,
        requests_per_window=(
            sum(s.requests for s in samples) / windows_total
            if with_stats and windows_total
            else None
        ),
        bytes_per_payload_byte=(
            sum(s.response_bytes for s in samples) / payload_total
            if with_stats and payload_total
            else None
        ),
        payload_mismatch=any(s.payload_bytes_returned != s.payload_bytes_expected for s in samples),
        samples=[{**asdict(s), "rate": s.rate} for s in samples],
    )


def verify(
    fetch: Callable[[int], Any],
    truth: Callable[[int], Any],
    windows: WindowSet,
    n: int,
) -> bool:
    """Compare ``n`` windows spread over the list (first and last included) exactly."""
    ids = sorted({int(i) for i in np.linspace(0, windows.count - 1, max(n, 2))})
    return all(payload_equal(fetch(i), truth(i)) for i in ids)


def verify_in_stream(
    fetch: Callable[[int], Any], data: TokensData, windows: WindowSet, n: int, exact: bool
) -> bool:
    """The next ``n`` windows of a system with an order of its own, found in the source:
    each at one of the workload's starts (exact), or anywhere in the stream (equivalent
    jobs: aligned blocks of the system's own layout)."""
    starts = windows.starts if exact else None
    return all(in_token_stream(data, fetch(i), starts) for i in range(max(n, 2)))
