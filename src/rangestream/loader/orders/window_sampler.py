"""Drawing frame windows of temporal records: a pure function of a counter, by rejection.

Temporal records (``TemporalArrayStorage``) have different frame counts; training reads
fixed-length windows of ``frames`` frames from records that have at least that many. The
reference adapter draws them with ``np.random`` inside ``__getitem__``, which makes the
sequence depend on worker seeding and impossible to resume exactly. Here sample ``i`` of
epoch ``e`` is a pure function of ``(seed, e, i)`` (:func:`keyed_hash`), so the epoch is a
sequence like any other: it is split across ranks and workers by :class:`EpochPlan`, and
resuming means nothing more than restarting the counter at ``consumed_samples``.

Drawing needs no array of every record's frame count (16 bytes per record to read and 24 to
hold in every worker: 2.4 GB at 10^8 records). What a draw reads is what the storage keeps
for it (``docs/format.md``): the frame-count histogram (how many records and windows there
are, read once), the cumulative index ``frame_starts`` (one entry per inner chunk of the
record index) and the record index chunks of the records proposed. A draw is rejection
sampling from a proposal the index answers cheaply:

- a uniform *global frame* (the cumulative index locates its record and frame), or
- a uniform *record* with a uniform start in ``[0, longest - frames]``,

accepted or not from the proposed record's frame count, so the accepted windows follow the
chosen policy exactly (every eligible record equally likely, or every valid window). The
histogram gives each proposal's acceptance rate exactly; the better one is used. Where both
accept less than :data:`MIN_ACCEPTANCE` of proposals (a window longer than almost every
record), drawing reads every record's frame count once and keeps the eligible records'
(the exact per-record draw), which is what the record counts then require.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rangestream.arguments import positive_integer
from rangestream.errors import CorruptDataError, LoaderConfigError
from rangestream.loader.orders.permutation import keyed_hash

__all__ = [
    "CountsIndex",
    "Draw",
    "Sampling",
    "WindowSampler",
    "answer",
    "answer_async",
    "check_sampling",
]

Sampling = Literal["record", "window"]

#: Below this acceptance rate, rejection would cost more index reads per window than
#: reading every record's frame count once: draws then use the eligible records' counts.
MIN_ACCEPTANCE = 1 / 16
#: Proposals after which a draw gives up: at ``MIN_ACCEPTANCE`` a counter is still pending
#: after 2,000 proposals with probability ``(15/16)^2000 < 1e-56``; only an index whose
#: histogram promises windows its records do not hold gets there.
MAX_ROUNDS = 2000

#: The purposes of a proposal's hashes: the proposal (a global frame, or a record), a
#: start within the proposed record (or the longest), the coin of a frame proposal under
#: record sampling.
#: Most proposals per counter asked about in one round.
MAX_CANDIDATES = 16
_PURPOSES = np.arange(3, dtype=np.int64)[:, None, None]
#: Counters times ``MAX_ROUNDS`` times the purposes stay below 2**63.
_MAX_COUNTER = (1 << 63) // (4 * MAX_ROUNDS)
_EXACT_RECORD = 4  # the exact per-record draw
_EXACT_START = 5


def check_sampling(sampling: object) -> None:
    if sampling not in ("record", "window"):
        raise LoaderConfigError(f"sampling must be 'record' or 'window', got {sampling!r}")


class CountsIndex:
    """The record-index questions of a draw, answered from frame counts held in memory.

    For datasets given as an array of frame counts (a subset of records, a test double);
    ``TemporalArrayStorage``'s readers answer the same questions by range.
    """

    def __init__(self, frame_counts: npt.ArrayLike) -> None:
        counts = np.asarray(frame_counts, dtype=np.int64).reshape(-1)
        if counts.size and int(counts.min()) < 1:
            raise LoaderConfigError(f"frame counts must be >= 1, found {int(counts.min())}")
        self.counts = counts
        self.ends = np.cumsum(counts)

    def frame_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        values, records = np.unique(self.counts, return_counts=True)
        return values.astype(np.int64), records.astype(np.int64)

    def locate_frames(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        records = np.searchsorted(self.ends, positions, side="right")
        return records, positions - (self.ends[records] - self.counts[records])

    def frame_counts_of(self, records: np.ndarray) -> np.ndarray:
        return self.counts[records]

    def frame_counts_between(self, low: int, high: int) -> np.ndarray:
        return self.counts[low:high]


#: A draw's question to the record index: a method name of ``CountsIndex`` (and of
#: ``TemporalReader`` / ``AsyncTemporalReader``) and its arguments.
Question = tuple[Any, ...]
Draw = Generator[Question, Any, tuple[np.ndarray, np.ndarray]]


def answer(draw: Draw, index: Any) -> tuple[np.ndarray, np.ndarray]:
    """Run ``draw`` against a sync index (``CountsIndex``, ``TemporalReader``)."""
    try:
        question = next(draw)
        while True:
            name, *arguments = question
            question = draw.send(getattr(index, name)(*arguments))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def answer_async(draw: Draw, index: Any) -> tuple[np.ndarray, np.ndarray]:
    """Run ``draw`` against an async index (``AsyncTemporalReader``; a sync one works too)
    on the running loop."""
    try:
        question = next(draw)
        while True:
            name, *arguments = question
            found = getattr(index, name)(*arguments)
            question = draw.send(await found if inspect.isawaitable(found) else found)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class WindowSampler:
    """Draw ``(record, start)`` windows of ``frames`` frames from counters.

    Parameters
    ----------
    histogram : (numpy.ndarray, numpy.ndarray)
        ``(frames, records)``: every distinct frame count and how many records have it
        (``TemporalReader.frame_histogram``); ``WindowSampler.of_counts`` builds one from
        an array of frame counts.
    frames : int
        Window length in frames; records with fewer frames are never drawn.
    sampling : {"record", "window"}, default "record"
        ``"record"``: every eligible record is equally likely, then a uniform start within
        it (the reference adapter's policy). ``"window"``: every valid ``(record, start)``
        pair is equally likely, so long records are drawn in proportion to their windows.

    Notes
    -----
    :meth:`draws` is a generator that asks the record index questions (see
    :func:`answer`); what it keeps is a few numbers, unless the proposals accept less than
    :data:`MIN_ACCEPTANCE` (then the eligible records' counts, read once).
    """

    def __init__(
        self,
        histogram: tuple[npt.ArrayLike, npt.ArrayLike],
        frames: int,
        *,
        sampling: Sampling = "record",
    ) -> None:
        frames = positive_integer(frames, "frames", error=LoaderConfigError)
        check_sampling(sampling)
        values = np.asarray(histogram[0], dtype=np.int64).reshape(-1)
        numbers = np.asarray(histogram[1], dtype=np.int64).reshape(-1)
        self.frames = int(frames)
        self.sampling: Sampling = sampling
        self.num_records = int(numbers.sum())
        self.total_frames = int((values * numbers).sum())
        self.longest = int(values.max()) if values.size else 0
        eligible = values >= self.frames
        self.num_eligible = int(numbers[eligible].sum())
        self.num_windows = int((numbers[eligible] * (values[eligible] - self.frames + 1)).sum())
        if self.num_eligible == 0:
            raise LoaderConfigError(
                f"no record has {self.frames} frames (records: {self.num_records}, longest: "
                f"{self.longest} frames); choose a shorter window"
            )
        starts = self.longest - self.frames + 1  # starts a record proposal draws from
        if sampling == "window":
            by_frame = self.num_windows / self.total_frames
            by_record = self.num_windows / (self.num_records * starts)
        else:
            by_frame = self.num_eligible * self.frames / self.total_frames
            by_record = self.num_eligible / self.num_records
        #: How proposals are made: ``"frame"``, ``"record"`` or ``"exact"`` (per record).
        self.proposal = "frame" if by_frame > by_record else "record"
        #: Share of proposals accepted (``1`` for the exact draw).
        self.acceptance = max(by_frame, by_record)
        if self.acceptance < MIN_ACCEPTANCE:
            self.proposal, self.acceptance = "exact", 1.0
        #: Proposals per counter per round: one round accepts 9 counters in 10.
        self.candidates = 1
        if self.acceptance < 1:
            wanted = np.ceil(np.log(0.1) / np.log1p(-self.acceptance))
            self.candidates = int(min(MAX_CANDIDATES, max(1, wanted)))
        #: The index :meth:`draw` asks when given none (``of_counts``: the counts given).
        self.index: Any = None
        self._eligible: np.ndarray | None = None
        self._spans: np.ndarray | None = None
        self._span_ends: np.ndarray | None = None

    @classmethod
    def of_counts(
        cls, frame_counts: npt.ArrayLike, frames: int, *, sampling: Sampling = "record"
    ) -> WindowSampler:
        """A sampler of the records whose frame counts are ``frame_counts`` (held here)."""
        index = CountsIndex(frame_counts)
        sampler = cls(index.frame_histogram(), frames, sampling=sampling)
        sampler.index = index
        return sampler

    def __repr__(self) -> str:
        return (
            f"WindowSampler(frames={self.frames}, sampling={self.sampling!r}, "
            f"proposal={self.proposal!r}, acceptance={self.acceptance:.3f})"
        )

    def draw(
        self, counters: npt.ArrayLike, *, seed: int, epoch: int, index: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`draws` answered by the sync ``index`` (``CountsIndex``, ``TemporalReader``;
        by default the counts given to :meth:`of_counts`)."""
        index = self.index if index is None else index
        if index is None:
            raise LoaderConfigError("draw needs an index: pass index= or use of_counts")
        return answer(self.draws(counters, seed=seed, epoch=epoch), index)

    def draws(
        self, counters: npt.ArrayLike, *, seed: int, epoch: int, candidates: int | None = None
    ) -> Draw:
        """Windows for sample counters of one epoch, asking the record index as needed.

        Parameters
        ----------
        counters : array_like of int
            Sample numbers within the epoch (non-negative).
        seed, epoch : int
            Select the random stream; equal inputs give equal windows in any process.
        candidates : int, optional
            Proposals per counter asked about in one round of index reads (the windows do
            not depend on it); by default enough for 9 counters in 10 to finish in one
            round, at most :data:`MAX_CANDIDATES`.

        Returns
        -------
        records, starts : numpy.ndarray
            ``int64`` arrays shaped like ``counters`` (the generator's return value).
        """
        counters = np.asarray(counters, dtype=np.int64)
        flat = counters.reshape(-1)
        if self.proposal == "exact":
            records, starts = yield from self._exact(flat, seed, epoch)
        else:
            if candidates is None:
                candidates = self.candidates
            records, starts = yield from self._rejection(flat, seed, epoch, candidates)
        return records.reshape(counters.shape), starts.reshape(counters.shape)

    def _rejection(self, counters: np.ndarray, seed: int, epoch: int, candidates: int) -> Draw:
        """Proposals ``0, 1, 2, ...`` of each counter until one is accepted; ``candidates``
        of them are asked about per round (the first accepted wins, so the result does not
        depend on it: fewer rounds of index reads, more entries read per round)."""
        if counters.size and int(counters.max()) >= _MAX_COUNTER:
            raise LoaderConfigError(f"sample counters must be below {_MAX_COUNTER}")
        frames = np.int64(self.frames)
        records = np.zeros(counters.shape, dtype=np.int64)
        starts = np.zeros(counters.shape, dtype=np.int64)
        pending = np.arange(counters.size)
        attempt = 0
        while pending.size:
            if attempt >= MAX_ROUNDS:
                raise CorruptDataError(
                    f"{pending.size} window(s) of {self.frames} frames were not found in "
                    f"{MAX_ROUNDS} proposals accepting {self.acceptance:.3f} of them: the "
                    "record index does not hold the windows its frame histogram counts"
                )
            tried = min(candidates, MAX_ROUNDS - attempt)
            # one hash per (candidate, counter, purpose): proposal j of counter c is the
            # same whatever the round it is asked in
            number = counters[pending][None, :] * MAX_ROUNDS + (
                attempt + np.arange(tried, dtype=np.int64)[:, None]
            )
            hashes = keyed_hash(number[None] * 4 + _PURPOSES, seed, epoch)
            proposed, start_hash, coin = hashes[0].ravel(), hashes[1].ravel(), hashes[2].ravel()
            if self.proposal == "frame":
                positions = (proposed % np.uint64(self.total_frames)).astype(np.int64)
                chosen, within = yield ("locate_frames", positions)
                chosen = np.asarray(chosen, dtype=np.int64)
            else:
                chosen = (proposed % np.uint64(self.num_records)).astype(np.int64)
            counts = np.asarray((yield ("frame_counts_of", chosen)), dtype=np.int64)
            if self.sampling == "window":
                if self.proposal == "record":
                    within = start_hash % np.uint64(self.longest - self.frames + 1)
                start = np.asarray(within, dtype=np.int64)
                accepted = start + frames <= counts
            else:
                accepted = counts >= frames
                if self.proposal == "frame":  # a record's frames are proposed, not it
                    accepted &= coin % counts.astype(np.uint64) < np.uint64(self.frames)
                spans = np.maximum(counts - frames + 1, 1).astype(np.uint64)
                start = (start_hash % spans).astype(np.int64)
            accepted = accepted.reshape(tried, pending.size)
            found = accepted.any(axis=0)
            first = accepted.argmax(axis=0)[found]
            flat = first * pending.size + np.flatnonzero(found)
            records[pending[found]] = chosen[flat]
            starts[pending[found]] = start[flat]
            pending = pending[~found]
            attempt += tried
        return records, starts

    def _exact(self, counters: np.ndarray, seed: int, epoch: int) -> Draw:
        if self._eligible is None:
            counts = np.asarray(
                (yield ("frame_counts_between", 0, self.num_records)), dtype=np.int64
            )
            eligible = np.flatnonzero(counts >= self.frames)
            if eligible.size != self.num_eligible:
                raise CorruptDataError(
                    f"the record index holds {eligible.size} records of at least "
                    f"{self.frames} frames, its frame histogram {self.num_eligible}"
                )
            self._spans = (counts[eligible] - self.frames + 1).astype(np.uint64)
            self._span_ends = np.cumsum(self._spans, dtype=np.uint64)
            self._eligible = eligible
        eligible, spans, span_ends = self._eligible, self._spans, self._span_ends
        assert spans is not None and span_ends is not None
        first = keyed_hash(counters, seed, epoch, _EXACT_RECORD)
        if self.sampling == "record":
            chosen = (first % np.uint64(eligible.size)).astype(np.int64)
            second = keyed_hash(counters, seed, epoch, _EXACT_START)
            starts = second % spans[chosen]
        else:
            target = first % span_ends[-1]
            chosen = np.searchsorted(span_ends, target, side="right").astype(np.int64)
            starts = target - (span_ends[chosen] - spans[chosen])
        return eligible[chosen], starts.astype(np.int64)
