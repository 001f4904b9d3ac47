"""Epoch orders as reads: the per-window shuffle and the block shuffle.

Why a second shuffle: a per-window shuffle over object storage costs one range request per
window (about 8 KiB), and an object store charges per request: the server's request rate
caps the loader and S3 bills every GET. The block shuffle reads **runs** (``run_windows``
consecutive windows, about 4 MiB, one range request, two where a block boundary cuts the
run) and mixes the windows of a **buffer** of ``buffer_runs`` runs, so memory per worker is
one buffer (plus what is read ahead) and requests per window fall by ``run_windows``.

Both orders answer the same question through the same objects: given the epoch, the
position (:class:`EpochPosition`), the rank and the DataLoader worker, which windows does
this worker read, grouped how (:class:`ReadGroup`, :class:`RunRead`), and into which slot
of which of this rank's steps does each window go (:class:`WorkerPlan`). Everything is a
pure function of plain integers: no per-epoch array of the dataset's size exists anywhere.

The block shuffle's epoch
-------------------------
Runs are the fixed grid ``run x = windows [x * R, min((x + 1) * R, n))`` (only the last run
can be short). A keyed :class:`~rangestream.loader.orders.permutation.Permutation` of the runs
orders them; consecutive groups of ``K`` permuted runs are buffers, and a second keyed
permutation per buffer orders the buffer's windows. The concatenation of the buffers is the
epoch's **order** ``Q``, a sequence of every window once. Its buffers are cut where the
epoch's *first* phase (below) cuts reader regions: a buffer that straddled two readers
would be read by both, each for part of every run (with four workers over a dataset of a
few runs per reader, 1.7 bytes read per byte of data); cut there, each reader's buffers hold
its runs alone. So ``Q`` depends on the first phase's world size, batch size and workers
(part of the position), and with one reader it is the fixed grid of ``K`` runs.

Ranks and workers do not take slices of every global batch of ``Q`` (each would then need
windows of every run of a buffer): each reader (a DataLoader worker of a rank) owns one
contiguous **region** of ``Q`` and walks it buffer by buffer, reading each of its buffers'
runs once. A phase (one run of training with fixed world size ``W``, batch size ``B``,
workers ``NW`` and ``drop_last``) cuts what remains of the epoch, ``V`` (the remaining
intervals of ``Q`` in order), into ``W`` rank regions of ``T * B`` windows (``T`` steps
each), and a rank region into ``NW`` worker regions: worker ``w`` builds the rank's steps
``w, w + NW, ...`` (the DataLoader's round robin) from the consecutive windows of its
region. With ``drop_last=False`` the last steps are filled by wrapping around to the start
of ``Q`` (as ``DistributedSampler`` pads).

Resuming
--------
After ``s`` steps of a phase every reader has consumed a prefix of its region, so what
remains is a list of intervals of ``Q`` computed from ``(s, W, B, NW, drop_last)`` alone.
Resuming with the same settings continues each reader where it stopped (the same order as
without the stop). Resuming with other settings starts a new phase over the remaining
intervals: every window not yet consumed is consumed exactly once by the new ranks, every
rank takes the same number of steps. The position is therefore the list of phases, five
integers each (:class:`EpochPosition`); a run that never changes its settings has one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rangestream.errors import OutOfRangeError, StateError
from rangestream.loader.orders.geometry import (
    DEFAULT_RUN_BYTES,
    WindowGeometry,
    check_count,
    run_windows_for,
)
from rangestream.loader.orders.permutation import Permutation, _mix_in_place, keyed_hash
from rangestream.loader.orders.phases import (
    EpochPosition,
    Phase,
    PhaseLayout,
    first_phase_cuts,
    phase_layout,
    reader_region,
)
from rangestream.loader.orders.worker_plan import (
    SPAN_MIN_FILL,
    ReadGroup,
    RunRead,
    WindowShuffle,
    WorkerPlan,
    check_worker,
)

__all__ = [
    "BUFFER_CUTS",
    "DEFAULT_BUFFER_RUNS",
    "DEFAULT_RUN_BYTES",
    "LEGACY_BUFFER_CUTS",
    "SPAN_MIN_FILL",
    "BlockShuffle",
    "EpochPosition",
    "Phase",
    "ReadGroup",
    "RunRead",
    "WindowGeometry",
    "WindowShuffle",
    "WorkerPlan",
    "buffer_runs_for",
    "phase_layout",
    "reader_region",
    "run_windows_for",
    "simulate_epoch",
]

DEFAULT_BUFFER_RUNS = 8
"""Runs mixed together per worker (``K``): a batch's windows come from about ``K`` places
of the source (one pair in nine shares a 4 MiB neighbourhood, measured), and a worker
holds ``K * run`` bytes (32 MiB with 4 MiB runs) plus the next buffer it reads ahead."""
BUFFER_CUTS = "first-phase"
"""How an epoch's buffers are cut, saved in every block-shuffled state (``buffer_cuts``):
at the reader regions of the epoch's first phase (:func:`first_phase_cuts`). The order ``Q``
depends on it as on the seed, so a state planned under another scheme is refused: its
consumed prefix of ``Q`` is not this order's, and the rest of the epoch would repeat some
windows and skip others."""
LEGACY_BUFFER_CUTS = "grid"
"""The scheme of states that carry no ``buffer_cuts`` (saved before it was recorded): the
fixed grid of ``K`` runs, whatever the readers."""
_RUN_ORDER = 0x52554E53  # purposes of the derived keys: the run order, a buffer's order
_BUFFER_ORDER = 0x42554646
_CUT_BUFFER_ORDER = 0x43555442  # a buffer cut at a reader region's edge, keyed by its bounds
_MAX_WALK = 64
"""Cycle-walking steps of the inverse before it is declared broken (a bijection's walk
averages under four on a domain below ``4 n``)."""


def _derived_seed(seed: int, purpose: int, index: int) -> int:
    return int(keyed_hash(np.array([index], dtype=np.int64), seed, purpose)[0])


def _inverse(permutation: Permutation, images: np.ndarray) -> np.ndarray:
    """Positions whose images are ``images`` (the Feistel rounds run backwards)."""
    n = permutation.n
    if n == 1:
        return np.zeros(images.shape, dtype=np.int64)
    half_bits = np.uint64(permutation._half_bits)
    mask = permutation._half_mask
    keys = permutation._round_keys[::-1]

    def backwards(values: np.ndarray) -> np.ndarray:
        left, right = values >> half_bits, values & mask
        for key in keys:
            # forwards: (left, right) -> (right, left ^ F(right))
            mixed = _mix_in_place(left ^ key)
            mixed &= mask
            left, right = right ^ mixed, left
        return (left << half_bits) | right

    flat = backwards(images.astype(np.uint64).ravel())
    limit = np.uint64(n)
    walking = np.flatnonzero(flat >= limit)
    for _ in range(_MAX_WALK):
        if not walking.size:
            return flat.astype(np.int64).reshape(images.shape)
        stepped = backwards(flat[walking])
        flat[walking] = stepped
        walking = walking[stepped >= limit]
    raise StateError(f"inverse of {permutation!r} did not return into [0, {n})")


def buffer_runs_for(
    num_windows: int, run_windows: int, readers: int, *, most: int = DEFAULT_BUFFER_RUNS
) -> int:
    """Runs per buffer that keep a reader's partial reads in proportion to its share.

    A reader (a DataLoader worker of a rank) owns about ``num_windows / readers`` windows,
    ``share`` runs' worth. Where its region starts or ends inside a buffer it reads every
    run of that buffer for part of their windows, about ``K`` runs per reader and phase
    beyond its share; capping ``K`` at ``share`` keeps those extra reads to about the share
    itself for small datasets (1.4-3.4x the payload bytes measured, see ``docs/design.md``)
    and negligible for large ones. Choose it once, when an epoch order is first made, and
    keep it (it defines the order) when the world size changes.
    """
    check_count("buffer_runs_for", "readers", readers, 1)
    check_count("buffer_runs_for", "run_windows", run_windows, 1)
    share = num_windows // (readers * run_windows)
    return max(1, min(most, share))


class _EpochOrder:
    """The block shuffle's order ``Q`` of one epoch: position -> window, O(1) per position.

    The permuted runs, concatenated, are the epoch's *run sequence* (``Q'`` positions:
    slot ``s`` covers ``[run_start(s), run_start(s + 1))``; only the short last run is
    shorter, which one inverse permutation locates). ``cuts`` (sorted ``Q'`` positions,
    ``0`` and ``n`` included) split it into regions; each region is cut into buffers of
    ``K`` slots counted from its first slot, a region's edges cutting its first and last
    buffer. ``Q`` is every buffer's windows in the buffer's own keyed order. Without cuts
    (one region) the buffers are the fixed grid of ``K`` slots; cut at the first phase's
    reader regions (:func:`~rangestream.loader.orders.phases.first_phase_cuts`), no buffer
    straddles two readers, so no run is read by two (each reader's part of a cut run is
    one contiguous span of it).

    A buffer is named by one integer, ``region * (num_buffers + 1) + index`` (in the first
    region, the index of the fixed grid); its order is keyed by its grid index if no cut
    touches it, else by its bounds.
    """

    def __init__(self, shuffle: BlockShuffle, epoch: int, cuts: tuple[int, ...] = ()) -> None:
        n, r, k = shuffle.num_windows, shuffle.run_windows, shuffle.buffer_runs
        self.n, self.r, self.k = n, r, k
        self.seed, self.epoch = shuffle.seed, epoch
        self.num_runs = -(-n // r)
        self.num_buffers = -(-self.num_runs // k)
        self.deficit = self.num_runs * r - n
        self.runs = Permutation(self.num_runs, _derived_seed(shuffle.seed, _RUN_ORDER, 0), epoch)
        self.short_slot = int(_inverse(self.runs, np.array([self.num_runs - 1]))[0])
        self._after_short = (self.short_slot + 1) * r - self.deficit  # Q' start of next slot
        edges = sorted({0, n, *(min(max(int(c), 0), n) for c in cuts)})
        self.cuts = np.asarray(edges, dtype=np.int64)
        self._first_slots = self.slot_of(self.cuts[:-1])
        self._stride = self.num_buffers + 1
        self._buffer_orders: dict[int, Permutation] = {}

    def run_start(self, slots: npt.ArrayLike) -> np.ndarray:
        """``Q'`` positions where ``slots`` start (``num_runs`` maps to ``n``)."""
        values = np.asarray(slots, dtype=np.int64)
        return values * self.r - np.where(values > self.short_slot, self.deficit, 0)

    def slot_of(self, positions: npt.ArrayLike) -> np.ndarray:
        """Slots of the run sequence holding ``Q'`` ``positions``."""
        values = np.asarray(positions, dtype=np.int64)
        shifted = values + np.where(values >= self._after_short, self.deficit, 0)
        return shifted // self.r

    def _bounds(self, buffer: int) -> tuple[int, int]:
        region, index = divmod(buffer, self._stride)
        first = int(self._first_slots[region]) + index * self.k
        low, high = int(self.cuts[region]), int(self.cuts[region + 1])
        start = max(low, int(self.run_start(first)))
        stop = min(high, int(self.run_start(min(first + self.k, self.num_runs))))
        return start, stop

    def buffer_start(self, buffer: int) -> int:
        return self._bounds(buffer)[0]

    def buffer_size(self, buffer: int) -> int:
        start, stop = self._bounds(buffer)
        return stop - start

    def buffer_of(self, positions: npt.ArrayLike) -> np.ndarray:
        """Buffers holding ``positions`` of the order (any shape)."""
        values = np.asarray(positions, dtype=np.int64)
        regions = np.searchsorted(self.cuts, values, side="right") - 1
        regions = np.minimum(regions, len(self.cuts) - 2)
        index = (self.slot_of(values) - self._first_slots[regions]) // self.k
        return regions * self._stride + index

    def _buffer_key(self, start: int, stop: int) -> int:
        """The key of a buffer's order: a buffer of the fixed grid keeps its grid key, so
        a buffer that no cut touches is ordered alike however the epoch is cut."""
        grid, offset = divmod(int(self.slot_of(start)), self.k)
        end = int(self.run_start(min((grid + 1) * self.k, self.num_runs)))
        if not offset and start == int(self.run_start(grid * self.k)) and stop == end:
            return _derived_seed(self.seed, _BUFFER_ORDER, grid)
        return _derived_seed(
            _derived_seed(self.seed, _CUT_BUFFER_ORDER, start), _CUT_BUFFER_ORDER, stop
        )

    def windows(self, buffer: int, offsets: np.ndarray) -> np.ndarray:
        """Windows at ``offsets`` (within ``buffer``) of the order."""
        start, stop = self._bounds(buffer)
        order = self._buffer_orders.get(buffer)
        if order is None:
            if len(self._buffer_orders) > 4:
                self._buffer_orders.clear()
            order = Permutation(stop - start, self._buffer_key(start, stop), self.epoch)
            self._buffer_orders[buffer] = order
        positions = start + order(offsets)
        slots = self.slot_of(positions)
        return self.runs(slots) * self.r + positions - self.run_start(slots)


@dataclass(frozen=True)
class BlockShuffle:
    """The block shuffle: runs of windows read whole, mixed within buffers of runs.

    Parameters
    ----------
    num_windows : int
        Windows in the dataset.
    seed : int
        Shuffle seed, equal on every rank.
    run_windows : int
        Consecutive windows per run (``R``): pick it with :func:`run_windows_for` so a run
        covers about :data:`DEFAULT_RUN_BYTES`.
    buffer_runs : int, default :data:`DEFAULT_BUFFER_RUNS`
        Runs mixed together (``K``); a worker holds one buffer of ``K * R`` windows.

    Notes
    -----
    Exactly once: the order ``Q`` is a bijection of the windows, readers' regions partition
    what remains, and steps are counted per phase. Cost: the epoch's buffers are cut where
    its first phase cuts reader regions (:func:`first_phase_cuts`), so in that phase every
    reader reads each run of its region once and no run is read by two readers (a run cut
    between two is read as two spans, one each). Only a later phase (a resume with another
    setting) cuts regions inside buffers: up to ``2 K`` partial runs per reader there, and
    the runs of the wrap-around padding.
    """

    num_windows: int
    seed: int
    run_windows: int
    buffer_runs: int = DEFAULT_BUFFER_RUNS

    def __post_init__(self) -> None:
        check_count("BlockShuffle", "num_windows", self.num_windows, 0)
        check_count("BlockShuffle", "run_windows", self.run_windows, 1)
        check_count("BlockShuffle", "buffer_runs", self.buffer_runs, 1)

    def order(self, epoch: int, position: EpochPosition | None = None) -> _EpochOrder:
        """The epoch's order ``Q``: its buffers cut at the reader regions of
        ``position``'s first phase, or (``None``) the fixed grid of ``K`` runs, which a
        single reader of the first phase walks too and a mixture's sources keep."""
        epoch = check_count("BlockShuffle", "epoch", epoch, 0)
        cuts = () if position is None else first_phase_cuts(self.num_windows, position)
        return _EpochOrder(self, epoch, cuts)

    def window_at(
        self, epoch: int, positions: npt.ArrayLike, position: EpochPosition | None = None
    ) -> np.ndarray:
        """Windows at ``positions`` of the epoch's order ``Q`` (as :meth:`order` cuts it
        for ``position``), O(1) per position."""
        values = np.asarray(positions, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.num_windows):
            raise OutOfRangeError(
                f"positions must lie in [0, {self.num_windows}) for {self!r}, found "
                f"[{values.min()}, {values.max()}]"
            )
        out = np.empty(values.shape, dtype=np.int64)
        if not values.size:
            return out
        order = self.order(epoch, position)
        flat, target = values.reshape(-1), out.reshape(-1)
        buffers = order.buffer_of(flat)
        for buffer in np.unique(buffers).tolist():
            chosen = np.flatnonzero(buffers == buffer)
            offsets = flat[chosen] - order.buffer_start(buffer)
            target[chosen] = order.windows(buffer, offsets)
        return out

    def _layout(self, position: EpochPosition) -> tuple[PhaseLayout, int]:
        """The current phase's layout (earlier phases replayed) and its steps taken."""
        return phase_layout(self.num_windows, position, owner=repr(self))

    def remaining(self, position: EpochPosition) -> list[tuple[int, int]]:
        """Intervals of ``Q`` not consumed at ``position`` (drop_last tails included)."""
        layout, steps = self._layout(position)
        starts, stops = layout.remaining_after(steps)
        return list(zip(starts.tolist(), stops.tolist(), strict=True))

    def num_steps(self, position: EpochPosition) -> int:
        """Steps every rank still takes in the current phase."""
        layout, steps = self._layout(position)
        return layout.num_steps - steps

    def worker_plan(
        self, epoch: int, position: EpochPosition, *, rank: int, worker_id: int
    ) -> WorkerPlan:
        """The remaining reads of ``worker_id`` of ``rank``: one group per buffer visited.

        Parameters
        ----------
        epoch : int
            Epoch played.
        position : EpochPosition
            Phases so far; the last one's setting is the one the worker runs with.
        rank, worker_id : int
            The reader.
        """
        phase = position.phase
        check_worker(rank, phase.world_size, worker_id, phase.num_workers)
        layout, done = self._layout(position)
        # Steps are numbered from the first remaining one, as the loader counts them, and
        # worker w builds steps w, w + NW, ... (the DataLoader's round robin); after a
        # resume inside the phase, that is the region of phase steps (w + done) mod NW.
        workers = phase.num_workers
        steps = np.arange(worker_id, layout.num_steps - done, workers, dtype=np.int64)
        region = (worker_id + done) % workers
        start, stop = layout.region(rank, region)
        start += layout.consumed(region, done)
        order = self.order(epoch, position) if self.num_windows else None
        return WorkerPlan(
            steps=steps,
            batch_size=phase.batch_size,
            groups=self._groups(order, layout, start, stop, steps),
            num_steps=layout.num_steps - done,
        )

    def _groups(
        self,
        order: _EpochOrder | None,
        layout: PhaseLayout,
        v_start: int,
        v_stop: int,
        steps: np.ndarray,
    ) -> Iterator[ReadGroup]:
        if order is None or v_start >= v_stop:
            return
        b = layout.phase.batch_size
        emitted = 0  # windows of this worker's remaining sequence already grouped
        first_local_step = steps[0] if steps.size else 0
        pieces: list[tuple[int, np.ndarray]] = []  # (buffer, windows) awaiting a group
        current: int | None = None

        def flush(buffer: int, parts: list[np.ndarray], emitted: int) -> ReadGroup:
            windows = np.concatenate(parts)
            local = np.arange(emitted, emitted + len(windows), dtype=np.int64)
            workers = layout.phase.num_workers
            group_steps = first_local_step + (local // b) * workers
            return ReadGroup(
                reads=self._run_reads(windows),
                windows=windows,
                steps=group_steps,
                slots=local % b,
                buffer=buffer,
            )

        for q_start, q_stop in layout.order_positions(v_start, v_stop):
            q = q_start
            while q < q_stop:
                buffer = int(order.buffer_of(q))
                buffer_start = order.buffer_start(buffer)
                end = min(q_stop, buffer_start + order.buffer_size(buffer))
                windows = order.windows(buffer, np.arange(q - buffer_start, end - buffer_start))
                if current is not None and buffer != current:
                    group = flush(current, [w for _, w in pieces], emitted)
                    emitted += len(group.windows)
                    pieces = []
                    yield group
                current = buffer
                pieces.append((buffer, windows))
                q = end
        if pieces and current is not None:
            yield flush(current, [w for _, w in pieces], emitted)

    def segments(
        self, epoch: int, start: int, stop: int
    ) -> Iterator[tuple[np.ndarray, tuple[RunRead, ...]]]:
        """Windows at positions ``[start, stop)`` of the epoch's order, buffer by buffer,
        with the run reads that cover them (listed by first use)."""
        if start >= stop:
            return
        order = self.order(epoch)
        q = start
        while q < stop:
            buffer = int(order.buffer_of(q))
            buffer_start = order.buffer_start(buffer)
            end = min(stop, buffer_start + order.buffer_size(buffer))
            windows = order.windows(buffer, np.arange(q - buffer_start, end - buffer_start))
            yield windows, self._run_reads(windows)
            q = end

    def _run_reads(self, windows: np.ndarray) -> tuple[RunRead, ...]:
        r = self.run_windows
        runs, first_use = np.unique(windows // r, return_index=True)
        reads = []
        for run, first in sorted(
            zip(runs.tolist(), first_use.tolist(), strict=True), key=lambda x: x[1]
        ):
            start = run * r
            stop = min(start + r, self.num_windows)
            needed = np.unique(windows[(windows >= start) & (windows < stop)])
            reads.append(RunRead(start, stop, needed, first))
        return tuple(reads)


def simulate_epoch(
    order: BlockShuffle | WindowShuffle, epoch: int, position: EpochPosition
) -> dict[tuple[int, int], np.ndarray]:
    """Every remaining ``(rank, step) -> windows`` of the current phase, from all workers.

    What all ranks and workers together would load; for tests and the quality benchmark.
    """
    phase = position.phase
    out: dict[tuple[int, int], np.ndarray] = {}
    for rank in range(phase.world_size):
        for worker in range(phase.num_workers):
            plan = order.worker_plan(epoch, position, rank=rank, worker_id=worker)
            for step, windows in plan.batches():
                out[(rank, step)] = windows
    return out
