"""How batches cross from DataLoader workers to the main process: small tensors by value.

torch sends a CPU tensor from a worker through shared memory: the worker puts it in a
shared segment, the main process receives its file descriptor and maps it. That costs the
main process about 0.4 ms per tensor whatever its size, and the main process receiving
batches is what bounds a local loader (two workers, 64 KiB batches of 8 token windows).
Pickled by value instead, a 64 KiB batch costs the main process about 0.14 ms (measured on
these 2-core machines with a bare DataLoader: 1,446 -> 6,003 batches/s). Copying through
the pipe grows with size while the mapping does not; they break even at about 512 KiB.

So inside a worker, stacked batch tensors of at most ``BY_VALUE_MAX_BYTES`` are made in
ordinary memory, and the loader's last step in the worker (``for_transport``) wraps them so
that pickling sends their bytes and unpickling in the main process rebuilds a tensor
(``torch.from_numpy`` over the received array: no further copy). Larger tensors keep the
shared-memory path. The user's collate function sees ordinary tensors either way, and the
main process receives ordinary tensors.

Narrow integers: token ids come as ``int64`` (what ``nn.Embedding`` takes) but are stored as
``uint16`` or ``int32``, so most of an ``int64`` batch's bytes are zeros. The main process
reads every byte of a message out of the pipe (and copies it again unpickling it), which
made up about 40% of its time per window; a by-value ``int64`` or ``int32`` tensor of at
least :data:`NARROW_MIN_ELEMENTS` elements therefore travels in the narrowest integer dtype
that holds its values (its minimum and maximum, checked in the worker: exact), and is cast
back to its own dtype on arrival. Token ids under 65,536 cross as ``uint16``: a quarter of
the bytes.

Bundles: every item a worker hands the DataLoader costs a fixed price on both sides,
whatever its size: in the main process an index sent to the worker, a poll, a pipe read, an
unpickle and torch's per-item bookkeeping (about 250 us a message on these 2-core machines);
in the worker a queue put and its feeder thread's pickling and write. With batches of 8
token windows that is most of the main process's time per batch; the main process is also
the training loop. A tagged worker (``StatefulDataLoader``) therefore sends its batches in
bundles of up to :data:`BUNDLE_BATCHES`, each batch still tagged with its step, and the main
process hands them out one by one in step order
(:class:`rangestream.loader.dataloader.StepIterator`). The first bundle of an iteration
holds one batch, so the time to the first batch is that of one batch; a bundle never waits
past the end of the worker's share.

Per-source I/O counters (:class:`SourceIO`): workers read; the loader in the training
process reports (``source_stats``). So a worker sends, with every batch, what each source's
reader made since its previous batch, and the loader adds it up: exact whatever the number
of workers, restarts or persistent workers. The counts are :data:`IO_FIELDS`: requests and
bytes fetched, and the node-local byte cache's hits, misses and bytes it served. A batch
that carries cache counts first adds them to the cache directory's ``STATS`` file, so
``rangestream cache`` shows what the loader counts while persistent workers live on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from rangestream.io.cache.settings import flush_stats as flush_cache_stats

__all__ = [
    "BUNDLE_BATCHES",
    "BY_VALUE_MAX_BYTES",
    "IO_FIELDS",
    "NARROW_MIN_ELEMENTS",
    "Bundle",
    "SourceIO",
    "bundled",
    "for_transport",
    "share_in_worker",
]

#: Largest tensor sent from a worker by value (pickled bytes) rather than shared memory.
BY_VALUE_MAX_BYTES = 256 * 1024

#: torch dtypes that ``Tensor.numpy()`` supports (bfloat16 and friends are not).
_NUMPY_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


def share_in_worker(nbytes: int) -> bool:
    """Whether a new batch tensor of ``nbytes`` should live in shared memory: in a worker,
    above ``BY_VALUE_MAX_BYTES``."""
    return nbytes > BY_VALUE_MAX_BYTES and get_worker_info() is not None


#: Fewest elements of an integer tensor sent narrowed (below, the check costs more than the
#: bytes it saves).
NARROW_MIN_ELEMENTS = 1024

#: Integer dtypes a wide integer tensor may travel as, narrowest first, with their ranges.
_NARROW = tuple(
    (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max), np.dtype(dtype))
    for dtype in (np.uint8, np.uint16, np.int16, np.int32)
)
_WIDE = frozenset({np.dtype(np.int64), np.dtype(np.int32)})


def _narrowed(array: np.ndarray) -> np.ndarray | None:
    """``array`` in the narrowest integer dtype that holds all its values, or ``None`` when
    it is not a wide integer array, too small to be worth it, or no narrower dtype fits."""
    if array.dtype not in _WIDE or array.size < NARROW_MIN_ELEMENTS:
        return None
    low, high = int(array.min()), int(array.max())
    for smallest, largest, dtype in _NARROW:
        if dtype.itemsize >= array.itemsize:
            return None
        if smallest <= low and high <= largest:
            return array.astype(dtype)
    return None


def _widened(narrow: np.ndarray, dtype: np.dtype[Any]) -> torch.Tensor:
    """The tensor a narrowed array stands for, in its own dtype (in the main process)."""
    return torch.from_numpy(narrow.astype(dtype))


class _TensorByValue:
    """A small tensor on its way to the main process; unpickles as a ``torch.Tensor``."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        narrow = _narrowed(self.array)
        if narrow is not None:
            return _widened, (narrow, self.array.dtype)
        return torch.from_numpy, (self.array,)


def _by_value(tensor: torch.Tensor) -> bool:
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and not tensor.requires_grad
        and not tensor.is_shared()
        and tensor.dtype in _NUMPY_DTYPES
        and tensor.is_contiguous()
        and tensor.nbytes <= BY_VALUE_MAX_BYTES
    )


def _wrap(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _TensorByValue(value.numpy()) if _by_value(value) else value
    if isinstance(value, Mapping):
        if type(value) is dict:
            return {key: _wrap(item) for key, item in value.items()}
        return value  # another mapping type: left as the user made it
    if isinstance(value, tuple):
        items = [_wrap(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if type(value) is list:
        return [_wrap(item) for item in value]
    return value


def for_transport(batch: Any) -> Any:
    """``batch`` ready to leave a worker: small CPU tensors in dicts, lists and tuples go by
    value (see the module docstring). Outside a worker nothing is pickled: returned as is."""
    if get_worker_info() is None:
        return batch
    if type(batch) is Bundle:
        return Bundle(_wrap(item) for item in batch)
    return _wrap(batch)


#: Most batches per message after the first (main-process CPU per window, batches of 8
#: windows of 2,049 tokens over S3: 40-50 us with one batch per message, about 20 with
#: bundles of four; ``docs/design.md``).
BUNDLE_BATCHES = 4


class Bundle(list[Any]):
    """Tagged batches ``(step, batch, io)`` that travel as one DataLoader item."""

    __slots__ = ()


def bundled(items: Iterator[Any], most: int = BUNDLE_BATCHES) -> Iterator[Bundle]:
    """``items`` in bundles: the first alone, then up to ``most`` at a time."""
    size = 1
    while True:
        bundle = Bundle()
        for item in items:
            bundle.append(item)
            if len(bundle) >= size:
                break
        if not bundle:
            return
        yield bundle
        size = most


#: What a reader's I/O counts hold, in order (``StatefulDataLoader.source_stats`` keys).
IO_FIELDS = ("requests", "bytes", "cache_hits", "cache_misses", "cache_bytes")
_NO_IO = (0,) * len(IO_FIELDS)


class SourceIO:
    """The I/O counts (:data:`IO_FIELDS`) of the readers of one process, as deltas between
    batches."""

    def __init__(self) -> None:
        self._reader: Any = None
        self._readers: list[Any] = []
        self._seen: list[tuple[int, ...]] = []
        self._counters: list[Callable[[], tuple[int, ...]]] = []

    def note(self, reader: Any, readers: list[Any]) -> None:
        """Count ``reader`` from now on: ``readers``, the reader of each of its sources
        (:meth:`~rangestream.loader.sources.protocol.SampleSource.source_readers`)."""
        if reader is not self._reader:
            self._reader = reader
            self._readers = readers
            self._seen = []
            self._counters = []

    def delta(self) -> list[tuple[int, ...]] | None:
        """The counts (:data:`IO_FIELDS`) per source since the previous call; ``None``
        before any reader was noted."""
        reader = self._reader
        if reader is None:
            return None
        if not self._counters:
            self._counters = [_io_counts(one) for one in self._readers]
        now = [counts() for counts in self._counters]
        seen = self._seen or [_NO_IO] * len(now)
        self._seen = now
        deltas = [
            tuple(a - b for a, b in zip(new, old, strict=True))
            for new, old in zip(now, seen, strict=True)
        ]
        if any(any(delta[2:]) for delta in deltas):
            # the byte cache's STATS file then holds at least what the loader will count
            flush_cache_stats()
        return deltas


def _io_counts(reader: Any) -> Callable[[], tuple[int, ...]]:
    """The counts (:data:`IO_FIELDS`) a reader has made so far, read cheaply every batch.

    A dataset reader's ``stats`` is a snapshot (about 20 us, per batch and source); the live
    counter behind it (``storage_reader.opened.reader.counter``, an ``IOCounter``) is summed
    in well under a microsecond. Readers without it fall back to ``stats``, and readers
    without either count nothing.
    """
    opened = getattr(getattr(reader, "storage_reader", None), "opened", None)
    counter = getattr(getattr(opened, "reader", None), "counter", None)
    kinds = getattr(counter, "kinds", None)
    cache = getattr(counter, "cache", None)
    if isinstance(kinds, dict) and isinstance(cache, list):

        def live() -> tuple[int, ...]:
            requests = nbytes = 0
            for count, size in list(kinds.values()):
                requests += count
                nbytes += size
            return requests, nbytes, cache[0], cache[1], cache[2]

        return live
    if hasattr(reader, "stats"):

        def snapshot() -> tuple[int, ...]:
            stats = reader.stats
            cached = (getattr(stats, name, 0) for name in IO_FIELDS[2:])
            return (stats.requests, stats.bytes, *cached)

        return snapshot
    return lambda: _NO_IO
