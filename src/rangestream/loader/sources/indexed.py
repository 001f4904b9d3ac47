"""Windows, documents and records read by index: the :class:`IndexedSource`.

The most common :class:`~rangestream.loader.sources.protocol.SampleSource`: a dataset whose
readers have ``read_many(indexes)`` (``StreamDataset``, ``DocumentDataset``, whole temporal
records), read in storage order, by a per-window :class:`Permutation`, or planned by the
block shuffle (:mod:`rangestream.loader.orders.block_shuffle`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

import numpy as np

from rangestream.arguments import positive_integer
from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.orders.block_shuffle import (
    BUFFER_CUTS,
    DEFAULT_RUN_BYTES,
    LEGACY_BUFFER_CUTS,
    BlockShuffle,
    buffer_runs_for,
)
from rangestream.loader.orders.permutation import Permutation
from rangestream.loader.sources.protocol import (
    EpochPlanning,
    SampleSource,
    Shuffle,
    storage_commit,
)

__all__ = [
    "SHUFFLES",
    "IndexedDataset",
    "IndexedSource",
    "shuffle_mode",
    "widen_integers",
    "widen_many",
]

#: Fields made by the loader, not read: kept in the dtype their consumer takes
#: (flash-attention's varlen kernels take ``int32`` ``cu_seqlens``).
_LOADER_FIELDS = frozenset({"cu_seqlens"})


def widen_integers(sample: Any, dtype: np.dtype[Any]) -> Any:
    """``sample`` with every integer array (plain, structured field, in a dict or tuple)
    cast to ``dtype``: token ids stored as ``uint16`` go into ``nn.Embedding`` and
    ``cross_entropy`` as they come. Booleans, floats, bytes and ``cu_seqlens`` stay."""
    if isinstance(sample, np.ndarray):
        names = sample.dtype.names
        if names:
            wide = np.dtype(
                [
                    (name, dtype if sample.dtype[name].kind in "iu" else sample.dtype[name])
                    for name in names
                ]
            )
            return sample.astype(wide) if wide != sample.dtype else sample
        if sample.dtype.kind in "iu" and sample.dtype != dtype:
            return sample.astype(dtype)
        return sample
    if isinstance(sample, Mapping):
        return {
            key: value if key in _LOADER_FIELDS else widen_integers(value, dtype)
            for key, value in sample.items()
        }
    if isinstance(sample, tuple):
        items = [widen_integers(item, dtype) for item in sample]
        return type(sample)(*items) if hasattr(sample, "_fields") else tuple(items)
    return sample


def widen_many(samples: Sequence[Any], dtype: np.dtype[Any]) -> list[Any]:
    """:func:`widen_integers` of every sample of one read, cast together where they agree.

    The samples of one ``read_many`` (a block-shuffle run: hundreds of windows) are
    usually alike: bare arrays, or dicts of arrays, of one shape and dtype per key. Cast
    one by one, each costs a walk of its structure and an ``astype`` (about 2.5 us a
    window of 2,049 tokens); alike, each key's arrays are cast in one copy into one array
    whose rows are the samples' new arrays (about 1.3 us). Rows of one array never
    overlap, so a sample changed in place changes no other. Samples that differ in
    structure, shape or dtype, structured arrays and loader fields take
    :func:`widen_integers` one by one; the values are the same either way.
    """
    if len(samples) > 1:
        first = samples[0]
        if type(first) is dict:
            alike = _widen_dicts(samples, list(first), dtype)
            if alike is not None:
                return alike
        elif type(first) is np.ndarray:
            column = _widen_column(samples, dtype)
            if column is not None:
                return list(column)
    return [widen_integers(sample, dtype) for sample in samples]


def _widen_column(values: Sequence[Any], dtype: np.dtype[Any]) -> Sequence[Any] | None:
    """``values`` (one key of every sample) widened together: the values themselves when
    they need no cast, rows of one new array when they do, ``None`` when they are not
    plain arrays of one shape and dtype (then each sample is widened alone)."""
    first = values[0]
    if type(first) is not np.ndarray:
        return None
    kind, shape = first.dtype, first.shape
    if kind.names is not None or not kind.isnative:
        return None
    for value in values:
        if type(value) is not np.ndarray or value.dtype != kind or value.shape != shape:
            return None
    if kind.kind not in "iu" or kind == dtype:
        return values  # as widen_integers leaves them
    out = np.empty((len(values), *shape), dtype=dtype)
    for row, value in enumerate(values):
        out[row] = value  # a cast copy, as ``astype`` makes
    return out


def _widen_dicts(samples: Sequence[Any], keys: list[Any], dtype: np.dtype[Any]) -> list[Any] | None:
    """Dict samples with the keys of the first, widened key by key; ``None`` if they are
    not all alike (:func:`_widen_column`)."""
    count = len(keys)  # the same keys in the same order: each sample's own order is kept
    for sample in samples:
        if type(sample) is not dict or len(sample) != count or list(sample) != keys:
            return None
    columns = []
    try:
        for key in keys:
            values = [sample[key] for sample in samples]
            column = values if key in _LOADER_FIELDS else _widen_column(values, dtype)
            if column is None:
                return None
            columns.append(column)
    except KeyError:
        return None
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


SHUFFLES = tuple(shuffle.mode for shuffle in (Shuffle.BLOCK, Shuffle.WINDOW, Shuffle.NONE))
"""Orders of an indexed source: the block shuffle (runs of windows read whole, mixed within
buffers: :mod:`rangestream.loader.orders.block_shuffle`), a per-window global shuffle, or storage
order."""


def shuffle_mode(shuffle: object) -> str | bool:
    """``shuffle`` as one of :data:`SHUFFLES` (``True`` is the per-window shuffle)."""
    return Shuffle.parse(shuffle).mode


#: How an indexed source's epoch is planned, by its shuffle.
_PLANNING = {
    Shuffle.WINDOW: EpochPlanning.SEQUENCE,
    Shuffle.NONE: EpochPlanning.SEQUENCE,
    Shuffle.BLOCK: EpochPlanning.BLOCKS,
}


def _optional_count(value: int | None, name: str) -> int | None:
    return None if value is None else positive_integer(value, name, error=LoaderConfigError)


class IndexedDataset(Protocol):
    """A picklable dataset whose readers index samples ``0 .. len(reader) - 1``.

    ``StreamDataset`` and ``DocumentDataset``: ``sync_reader()`` and ``async_reader()``
    open nothing until entered, and their readers have ``read_many(indexes)``.
    """

    def async_reader(self) -> AbstractAsyncContextManager[Any]: ...

    def sync_reader(self) -> AbstractContextManager[Any]: ...


class IndexedSource(SampleSource):
    """Windows, documents or records of a dataset read by index.

    Parameters
    ----------
    dataset : IndexedDataset
        ``StreamDataset``, ``DocumentDataset`` or any dataset with the same readers.
    shuffle : {"block", "window", False}, default "window"
        ``"window"`` (or ``True``): a seeded global :class:`Permutation` per epoch.
        ``"block"``: the block shuffle (:mod:`rangestream.loader.orders.block_shuffle`); the loader
        plans it by regions and reads runs whole, this source reads in storage order.
        ``False``: storage order.
    seed : int, default 0
        Seed of the shuffle; equal on every rank.
    run_windows, buffer_runs : int, optional
        The block shuffle's run length and runs per buffer; chosen from the data and the
        number of readers when omitted, and kept in the loader's state once chosen.
    token_dtype : str or numpy dtype, optional
        Cast every integer array of a sample to this dtype as it is read (token ids:
        ``"int64"`` from ``from_storage``); ``None`` keeps the stored dtype.
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        *,
        shuffle: str | bool = "window",
        seed: int = 0,
        run_windows: int | None = None,
        buffer_runs: int | None = None,
        token_dtype: str | np.dtype[Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.token_dtype = None if token_dtype is None else np.dtype(token_dtype)
        if self.token_dtype is not None and self.token_dtype.kind not in "iu":
            raise LoaderConfigError(f"token_dtype must be an integer dtype, got {token_dtype!r}")
        #: The order, parsed once from ``shuffle``.
        self.order = Shuffle.parse(shuffle)
        self.planning = _PLANNING[self.order]
        self.seed = int(seed)
        self.run_windows = _optional_count(run_windows, "run_windows")
        self.buffer_runs = _optional_count(buffer_runs, "buffer_runs")
        #: The block shuffle's parameters given by the caller (others are chosen, and a
        #: resumed loader takes them from its state).
        self.explicit = frozenset(
            name
            for name, value in (("run_windows", run_windows), ("buffer_runs", buffer_runs))
            if value is not None
        )
        self._permutation: Permutation | None = None
        self._kept: Any = None
        #: Storage bytes from one sample's start to the next's, when samples in storage
        #: order are adjacent (windows; documents, on average). Asked here, in the process
        #: that builds the loader: a storage opened without a format learns its dtype by
        #: opening (a blocking call), which cannot happen later, where workers plan on
        #: their I/O loop. Not needed, and so not asked, for the per-window shuffle.
        self.span_bytes: int | None = None
        if self.order is not Shuffle.WINDOW:
            span = getattr(dataset, "sample_span_bytes", None)
            self.span_bytes = int(span) if isinstance(span, int) and span > 0 else None

    @property
    def shuffle(self) -> str | bool:
        """The shuffle as given: ``"window"``, ``"block"`` or ``False``."""
        return self.order.mode

    def __repr__(self) -> str:
        return f"IndexedSource({self.dataset!r}, shuffle={self.shuffle!r}, seed={self.seed})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kept"] = None  # readers are per process
        return state

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {
            "kind": "indexed",
            "shuffle": self.order.value,
            "seed": self.seed,
        }
        if self.planning is EpochPlanning.BLOCKS:
            identity["run_windows"] = self.run_windows
            identity["buffer_runs"] = self.buffer_runs
            identity["buffer_cuts"] = BUFFER_CUTS
        return identity

    def describe_data(self) -> dict[str, Any]:
        described: dict[str, Any] = {"num_samples": self.count()}
        commit = storage_commit(getattr(self.dataset, "storage", None))
        if commit is not None:
            described["commit"] = commit
        for name in ("sequence_length", "stride", "next_token"):
            value = getattr(self.dataset, name, None)
            if isinstance(value, (bool, int)):
                described[name] = value
        return described

    def count(self) -> int:
        if hasattr(type(self.dataset), "__len__"):
            return len(self.dataset)  # type: ignore[arg-type]
        with self.dataset.sync_reader() as reader:
            return len(reader)

    def num_samples(self, reader: Any) -> int:
        return len(reader)

    def positions(self, indices: np.ndarray, num_samples: int, epoch: int) -> np.ndarray:
        """Sample positions of epoch-sequence ``indices`` (the per-window shuffle, if on)."""
        if self.order is not Shuffle.WINDOW:
            return np.asarray(indices, dtype=np.int64)
        permutation = self._permutation
        if permutation is None or (permutation.n, permutation.epoch) != (num_samples, epoch):
            permutation = self._permutation = Permutation(num_samples, self.seed, epoch)
        return permutation(indices)

    def requests(self, reader: Any, indices: np.ndarray, epoch: int) -> Sequence[int]:
        positions: list[int] = self.positions(indices, len(reader), epoch).tolist()
        return positions

    def open_sync(self) -> AbstractContextManager[Any] | None:
        if getattr(self.dataset, "is_local", False):
            return self.dataset.sync_reader()
        return None

    def open_async(self) -> AbstractAsyncContextManager[Any]:
        return self.dataset.async_reader()

    def _cast(self, samples: Any) -> list[Any]:
        dtype = self.token_dtype
        if dtype is None:
            return list(samples)
        return widen_many(samples, dtype)

    def read_many_sync(self, reader: Any, requests: list[int]) -> list[Any]:
        return self._cast(reader.read_many(requests))

    async def read_many(self, reader: Any, requests: list[int]) -> list[Any]:
        # One read_many: the batch's ranges are coalesced (adjacent windows: one request).
        return self._cast(await reader.read_many(requests))

    def block_shuffle(self, num_samples: int, readers: int) -> BlockShuffle:
        """The block shuffle of an epoch of ``num_samples`` read by ``readers`` workers.

        Its run length and buffer size are chosen on first use (runs of about
        :data:`DEFAULT_RUN_BYTES`, buffers capped at each reader's share of runs) and then
        kept: they define the order, so a resumed loader takes them from the state.
        """
        if self.run_windows is None:
            span = self.span_bytes
            if span is None:
                raise LoaderConfigError(
                    f"shuffle='block' needs samples adjacent in storage (token windows, "
                    f"documents); {self.dataset!r} has none: use shuffle='window'"
                )
            self.run_windows = max(1, DEFAULT_RUN_BYTES // span)
        if self.buffer_runs is None:
            self.buffer_runs = buffer_runs_for(num_samples, self.run_windows, readers)
        return BlockShuffle(num_samples, self.seed, self.run_windows, self.buffer_runs)

    def adopt_order_parameters(self, state: Mapping[str, Any]) -> None:
        """Take the block shuffle's parameters from a saved state, unless given here.

        Raises
        ------
        StateError
            The state is block-shuffled but its buffers were cut by another scheme
            (``buffer_cuts``; none recorded: :data:`LEGACY_BUFFER_CUTS`): its epoch's order
            is another one.
        """
        if self.planning is not EpochPlanning.BLOCKS:
            return
        if state.get("kind") == "indexed" and state.get("shuffle") == self.order.value:
            check_buffer_cuts(state)
        for key in ("run_windows", "buffer_runs"):
            saved = state.get(key)
            if key not in self.explicit and type(saved) is int and saved > 0:
                setattr(self, key, saved)

    def sample_span_bytes(self) -> int | None:
        return self.span_bytes

    def reads_per_batch(self) -> int:
        return 1

    def window_length(self) -> int | None:
        return getattr(self.dataset, "window_length", None)

    def shuffles_itself(self) -> bool:
        return self.order is not Shuffle.NONE

    def preload(self) -> None:
        preload = getattr(getattr(self.dataset, "storage", None), "preload_readers", None)
        if callable(preload):
            preload()


def check_buffer_cuts(state: Mapping[str, Any]) -> None:
    """Refuse a block-shuffled state whose epoch order was cut into buffers by a scheme
    other than :data:`BUFFER_CUTS`, naming both (the old one included, which recorded none)."""
    saved = state.get("buffer_cuts", LEGACY_BUFFER_CUTS)
    if saved == BUFFER_CUTS:
        return
    how = (
        "no buffer_cuts: it was saved before the scheme was recorded, with buffers on the "
        f"fixed grid of buffer_runs runs (buffer_cuts={LEGACY_BUFFER_CUTS!r})"
        if "buffer_cuts" not in state
        else f"buffer_cuts={saved!r}"
    )
    raise StateError(
        f"cannot resume: the block-shuffled state has {how}, but this loader cuts an epoch's "
        f"buffers at its first phase's reader regions (buffer_cuts={BUFFER_CUTS!r}); the "
        f"epoch's order differs, so the rest of epoch {state.get('epoch')!r} would repeat "
        "some windows and skip others. Finish that epoch with the version that saved the "
        "state, or start a later epoch afresh (loader.set_epoch) without it"
    )
