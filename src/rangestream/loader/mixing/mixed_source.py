"""A weighted mixture of sample sources, as one sample source.

Each source is read in storage order (windows, documents) or by its own draws (temporal
windows); :class:`~rangestream.loader.mixing.mixed_order.MixedOrder` says which source and which
sample each position of the epoch takes, exact at every prefix and shuffled per source. So the
loader plans, reads ahead, counts and resumes a mixture exactly as one source: the position
is still ``consumed_samples``. A batch's requests are grouped by source and each group is
read with its source's own ``read_many`` (concurrently over a remote store), so mixing adds
no request beyond what each source's reads cost alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

import numpy as np

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.mixing.mixed_order import MixedOrder
from rangestream.loader.mixing.mixture import Mixture, MixtureSource
from rangestream.loader.orders.block_shuffle import DEFAULT_RUN_BYTES, BlockShuffle, buffer_runs_for
from rangestream.loader.sources.protocol import EpochPlanning, SampleSource, Shuffle
from rangestream.loader.sources.storage_kinds import (
    SourceOptions,
    build_source,
    default_shuffle,
    storage_kind,
)

__all__ = ["MixedReader", "MixedSource", "mixed_source"]

#: Storage kinds whose samples batch together.
_SAMPLE_SHAPES = {
    "stream": "windows",
    "stream_with_meta": "windows",
    "document": "documents",
    "temporal": "temporal windows",
    "temporal_records": "whole temporal records",
}


class MixedReader:
    """The readers of a mixture's sources, opened together in one process."""

    def __init__(self, readers: list[Any]) -> None:
        self.readers = readers

    def io(self) -> list[tuple[int, int]]:
        """Requests and bytes each source's reader has issued so far (``(0, 0)`` where a
        reader keeps no counters)."""
        counts = []
        for reader in self.readers:
            stats = getattr(reader, "stats", None)
            counts.append((0, 0) if stats is None else (stats.requests, stats.bytes))
        return counts


class MixedSource(SampleSource):
    """Sources mixed by weight into one epoch order (see
    :mod:`rangestream.loader.mixing.mixed_order`).

    Parameters
    ----------
    sources : mapping of name to SampleSource
        Each source in storage order (an ``IndexedSource(shuffle=False)``) or drawing its
        own samples (a ``TemporalWindowSource``); every source's samples must collate
        together (same fields and shapes).
    weights : mapping of name to float
        Relative weights, the same names.
    num_samples : int, optional
        Positions per epoch; by default the most for which no source repeats.
    seed : int, default 0
        Seed of every source's shuffle (each derives its own from its name).
    shuffle : {True, "window", "block", False}, default True
        Shuffle each source per sample (``True`` or ``"window"``: a fresh order per pass),
        with its own block shuffle (``"block"``: runs of about 4 MiB read whole, see
        :mod:`rangestream.loader.reading.mixed_blocks`), or read each in storage order.
    run_windows, buffer_runs : sequence of int, optional
        The block shuffle's parameters per source; chosen from the data when omitted and
        kept in the state once chosen.
    sizes : mapping of name to int, optional
        Samples of each source, if already counted; counted here otherwise (which opens
        each source in this process).
    """

    def __init__(
        self,
        sources: Mapping[str, SampleSource],
        weights: Mapping[str, float],
        *,
        num_samples: int | None = None,
        seed: int = 0,
        shuffle: bool | str = True,
        sizes: Mapping[str, int] | None = None,
        run_windows: Sequence[int | None] | None = None,
        buffer_runs: Sequence[int | None] | None = None,
    ) -> None:
        if set(sources) != set(weights):
            raise LoaderConfigError(
                f"sources and weights must name the same sources: {sorted(sources)} and "
                f"{sorted(weights)}"
            )
        self.names = list(sources)
        self.sources = [sources[name] for name in self.names]
        for name, source in zip(self.names, self.sources, strict=True):
            if source.shuffles_itself():
                raise LoaderConfigError(
                    f"mixture source {name!r} must be in storage order (the mixture shuffles "
                    f"each source itself), got {source!r}"
                )
        counted = {name: int(sizes[name]) for name in self.names} if sizes else {}
        for name, source in zip(self.names, self.sources, strict=True):
            if name not in counted:
                counted[name] = int(source.count())
            if counted[name] < 1:
                raise LoaderConfigError(f"mixture source {name!r} has no sample")
        mixture = Mixture(
            tuple(MixtureSource(name, counted[name], weights[name]) for name in self.names),
            num_samples=num_samples,
            seed=seed,
        )
        self.seed = mixture.seed
        #: The shuffle, parsed once: each source per sample, by its own block shuffle, or
        #: none (storage order).
        self.shuffled = _parse_shuffle(shuffle)
        self.planning = _PLANNING[self.shuffled]
        self.order = MixedOrder(mixture, shuffle=self.shuffled is not Shuffle.NONE)
        count = len(self.names)
        self.run_windows: list[int | None] = list(run_windows or [None] * count)
        self.buffer_runs: list[int | None] = list(buffer_runs or [None] * count)
        if len(self.run_windows) != count or len(self.buffer_runs) != count:
            raise LoaderConfigError(
                f"run_windows and buffer_runs need one value per source ({count})"
            )
        self.explicit = frozenset(
            name
            for name, values in (("run_windows", run_windows), ("buffer_runs", buffer_runs))
            if values is not None
        )

    def __repr__(self) -> str:
        return f"MixedSource({self.order!r})"

    @property
    def shuffle(self) -> bool | str:
        """The shuffle as its identity records it: ``True``, ``"block"`` or ``False``."""
        return self.shuffled.value  # type: ignore[no-any-return]

    @property
    def mixture(self) -> Mixture:
        return self.order.mixture

    # -- identity and the order's state --------------------------------------------------

    def identity(self) -> dict[str, Any]:
        identity = {
            "kind": "mixture",
            "seed": self.seed,
            "shuffle": self.shuffled.value,
            "sources": list(self.names),
            "sizes": list(self.mixture.sizes),
            "source_orders": [source.identity() for source in self.sources],
        }
        if self.planning is EpochPlanning.MIXED_BLOCKS:
            identity["run_windows"] = list(self.run_windows)
            identity["buffer_runs"] = list(self.buffer_runs)
        return identity

    def describe_data(self) -> dict[str, Any]:
        return {"source_data": [source.describe_data() for source in self.sources]}

    def block_shuffle(self, num_samples: int, readers: int) -> list[BlockShuffle]:
        """Each source's block shuffle (parameters chosen on first use, then kept).

        Runs cover about :data:`DEFAULT_RUN_BYTES` of the source; a source's buffers are
        capped at each reader's share of its runs, counted from its draws per epoch (its
        quota), as :func:`buffer_runs_for` caps them for one source.
        """
        shuffles = []
        for number, (name, source) in enumerate(zip(self.names, self.sources, strict=True)):
            if self.run_windows[number] is None:
                span = source.sample_span_bytes()
                if not isinstance(span, int) or span < 1:
                    raise LoaderConfigError(
                        f"shuffle='block' needs samples adjacent in storage in every source; "
                        f"{name!r} has none: use shuffle='window'"
                    )
                self.run_windows[number] = max(1, DEFAULT_RUN_BYTES // span)
            runs = self.run_windows[number]
            assert runs is not None
            if self.buffer_runs[number] is None:
                quota = self.mixture.quotas[number]
                self.buffer_runs[number] = buffer_runs_for(quota, runs, readers)
            size, seed = self.mixture.sizes[number], self.mixture.source_seed(number)
            buffers = self.buffer_runs[number]
            assert buffers is not None
            shuffles.append(BlockShuffle(size, seed, runs, buffers))
        return shuffles

    def adopt_order_parameters(self, state: Mapping[str, Any]) -> None:
        """Take the block shuffle's parameters from a saved state, unless given here."""
        if self.planning is not EpochPlanning.MIXED_BLOCKS:
            return
        for key in ("run_windows", "buffer_runs"):
            saved = state.get(key)
            if (
                key not in self.explicit
                and isinstance(saved, list)
                and len(saved) == len(self.names)
                and all(type(value) is int and value > 0 for value in saved)
            ):
                setattr(self, key, list(saved))

    def order_state(self) -> dict[str, Any]:
        """The mixture's weights, epoch length and curriculum phases (plain data)."""
        return self.order.state_dict()

    def load_order_state(
        self, state: Mapping[str, Any] | None, *, epoch: int, position: int
    ) -> None:
        """Continue a saved run's weights and curriculum phases.

        Built with the weights the saved run was built with, this source continues the
        saved curriculum exactly (weights set during the saved run stay in force). Built
        with other weights, those take over from ``position`` of ``epoch``: a curriculum
        step between two runs.
        """
        if not isinstance(state, dict):
            raise StateError(f"the state has no mixture state ('mixture': {state!r})")
        requested = self.order.weights
        self.order.load_state_dict(state)
        if requested != self.order.mixture.weights:
            self.order.set_weights(requested, epoch=epoch, position=position)

    def set_weights(self, weights: Mapping[str, float], *, epoch: int, position: int) -> None:
        """Interleave with ``weights`` from ``position`` of ``epoch`` on."""
        self.order.set_weights(weights, epoch=epoch, position=position)

    def source_counts(self, epoch: int, start: int, stop: int) -> dict[str, int]:
        """Samples of each source among positions ``[start, stop)`` of ``epoch``."""
        counts = self.order.source_counts(epoch, start, stop)
        return {name: int(count) for name, count in zip(self.names, counts, strict=True)}

    # -- the SampleSource protocol -------------------------------------------------------

    def count(self) -> int:
        return self.order.samples_per_epoch

    def num_samples(self, reader: MixedReader) -> int:
        for name, source, child, size in zip(
            self.names, self.sources, reader.readers, self.mixture.sizes, strict=True
        ):
            found = source.num_samples(child)
            if found != size:
                raise StateError(
                    f"mixture source {name!r} had {size} samples when the loader was built "
                    f"but has {found} now; the dataset changed underneath the loader"
                )
        return self.order.samples_per_epoch

    def requests(self, reader: MixedReader, indices: np.ndarray, epoch: int) -> list[Any]:
        sources, samples = self.order.locate(indices, epoch)
        out: list[Any] = [None] * len(sources)
        for number in np.unique(sources).tolist():
            chosen = np.flatnonzero(sources == number)
            child = self.sources[number].requests(reader.readers[number], samples[chosen], epoch)
            for at, request in zip(chosen.tolist(), child, strict=True):
                out[at] = (number, request)
        return out

    def open_sync(self) -> AbstractContextManager[Any] | None:
        contexts = [source.open_sync() for source in self.sources]
        if any(context is None for context in contexts):
            return None  # a remote source: everything is read through the I/O loop
        return _enter_all(contexts)  # type: ignore[arg-type]

    def open_async(self) -> AbstractAsyncContextManager[MixedReader]:
        return _aenter_all([source.open_async() for source in self.sources])

    def read_many_sync(self, reader: MixedReader, requests: list[Any]) -> list[Any]:
        out: list[Any] = [None] * len(requests)
        for number, (places, wanted) in _by_source(requests).items():
            got = self.sources[number].read_many_sync(reader.readers[number], wanted)
            for at, sample in zip(places, got, strict=True):
                out[at] = sample
        return out

    async def read_many(self, reader: MixedReader, requests: list[Any]) -> list[Any]:
        groups = _by_source(requests)
        results = await asyncio.gather(
            *(
                self.sources[number].read_many(reader.readers[number], wanted)
                for number, (_, wanted) in groups.items()
            )
        )
        out: list[Any] = [None] * len(requests)
        for (places, _), got in zip(groups.values(), results, strict=True):
            for at, sample in zip(places, got, strict=True):
                out[at] = sample
        return out

    def sample_span_bytes(self) -> int | None:
        return None

    def shuffles_itself(self) -> bool:
        return self.shuffled is not Shuffle.NONE

    def source_readers(self, reader: MixedReader) -> list[Any]:
        return list(reader.readers)

    def reads_per_batch(self) -> int:
        return int(sum(weight > 0 for weight in self.order.weights))

    def preload(self) -> None:
        for source in self.sources:
            source.preload()


#: How a mixture's epoch is planned, by its shuffle.
_PLANNING = {
    Shuffle.WINDOW: EpochPlanning.SEQUENCE,
    Shuffle.NONE: EpochPlanning.SEQUENCE,
    Shuffle.BLOCK: EpochPlanning.MIXED_BLOCKS,
}


def _parse_shuffle(shuffle: object) -> Shuffle:
    """A mixture's ``shuffle`` argument (``True``, ``"window"``, ``"block"``, ``False``)."""
    if shuffle not in (True, False, "window", "block"):
        raise LoaderConfigError(
            f"a mixture's shuffle must be True, 'window', 'block' or False, got {shuffle!r}"
        )
    if shuffle == "block":
        return Shuffle.BLOCK
    return Shuffle.WINDOW if shuffle else Shuffle.NONE


def _by_source(requests: Sequence[tuple[int, Any]]) -> dict[int, tuple[list[int], list[Any]]]:
    groups: dict[int, tuple[list[int], list[Any]]] = {}
    for at, (number, request) in enumerate(requests):
        places, wanted = groups.setdefault(number, ([], []))
        places.append(at)
        wanted.append(request)
    return groups


@contextlib.contextmanager
def _enter_all(contexts: list[AbstractContextManager[Any]]) -> Any:
    with contextlib.ExitStack() as stack:
        yield MixedReader([stack.enter_context(context) for context in contexts])


@contextlib.asynccontextmanager
async def _aenter_all(contexts: list[AbstractAsyncContextManager[Any]]) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        yield MixedReader([await stack.enter_async_context(context) for context in contexts])


def mixed_source(
    weights: Mapping[Any, float],
    options: SourceOptions,
    *,
    names: Mapping[Any, str] | None = None,
    per_source: Mapping[Any, Mapping[str, Any]] | None = None,
    num_samples: int | None = None,
    seed: int = 0,
    shuffle: bool | str = True,
) -> MixedSource:
    """The :class:`MixedSource` of ``{storage: weight}``: each storage's source built by its
    kind in storage order (the mixture shuffles), with ``per_source`` overrides."""
    if not isinstance(weights, Mapping) or not weights:
        raise LoaderConfigError(
            f"from_storages needs a mapping of storages to weights, got {weights!r}"
        )
    order = _parse_shuffle(shuffle)
    extra = [key for key in (per_source or {}) if key not in weights]
    extra += [key for key in (names or {}) if key not in weights]
    if extra:
        raise LoaderConfigError(f"per_source and names must name mixed storages, got {extra!r}")
    sources: dict[str, SampleSource] = {}
    named_weights: dict[str, float] = {}
    shapes = set()
    for storage, weight in weights.items():
        name = (names or {}).get(storage) or str(getattr(storage, "url", repr(storage)))
        if name in sources:
            raise LoaderConfigError(
                f"two mixed storages are both named {name!r}; pass names={{storage: name}}"
            )
        kind = storage_kind(storage)
        own = options.with_values(dict((per_source or {}).get(storage, {})))
        if kind == "temporal_records" and own.sequence_length is not None:
            kind = "temporal"  # windows of a split's records
        shapes.add(_SAMPLE_SHAPES.get(kind, kind))
        if kind != "temporal":  # windows are drawn; everything else the mixture shuffles
            own = own.with_values({"shuffle": False})
        sources[name] = build_source(storage, own)
        named_weights[name] = weight
    if len(shapes) > 1:
        raise LoaderConfigError(
            f"mixed storages must share a sample shape, got {sorted(shapes)}; mix storages of "
            "one kind (stream windows, documents or temporal windows)"
        )
    lengths = {source.window_length() for source in sources.values()}
    if len(lengths) > 1:
        raise LoaderConfigError(
            f"mixed windows must have one length, got {sorted(lengths, key=str)} "
            "(sequence_length and next_token per source)"
        )
    if shuffle is True:  # the storages' default: the block shuffle if any is remote
        windows = shapes == {"windows"}
        remote = any(
            Shuffle.parse(default_shuffle(storage)) is Shuffle.BLOCK for storage in weights
        )
        order = Shuffle.BLOCK if windows and remote else Shuffle.WINDOW
    if order is Shuffle.BLOCK and shapes != {"windows"}:
        raise LoaderConfigError(
            f"shuffle='block' mixes stream windows only, got {sorted(shapes)}; use shuffle='window'"
        )
    return MixedSource(
        sources, named_weights, num_samples=num_samples, seed=seed, shuffle=order.value
    )
