"""Which iterable dataset serves which kind of storage.

``StatefulDataLoader.from_storage`` dispatches on ``storage.kind``, a string attribute every
storage class carries:

========================  ====================================================================
``"stream"``              ``StreamStorage``: windows of ``sequence_length`` elements
``"stream_with_meta"``    ``StreamWithMetaStorage``: the same windows, with their payloads
``"document"``            ``DocumentStorage``: one document per sample
``"temporal"``            ``TemporalArrayStorage``: random windows of ``sequence_length`` frames
========================  ====================================================================

Duck typing on one attribute keeps this layer free of imports from ``storage/`` (data flows
loader -> dataset -> storage, and the loader needs only the dataset classes). A new storage
kind registers a builder with :func:`register_storage_kind`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rangestream.errors import LoaderConfigError
from rangestream.loader.iterable import BatchIterableDataset, Collate, IndexedBatchDataset
from rangestream.loader.temporal import TemporalBatchDataset

__all__ = [
    "DatasetBuilder",
    "LoaderOptions",
    "build_dataset",
    "register_storage_kind",
    "registered_kinds",
    "storage_kind",
]


@dataclass(frozen=True)
class LoaderOptions:
    """Every dataset-side option of ``StatefulDataLoader.from_storage``, for builders."""

    sequence_length: int | None
    batch_size: int
    rank: int | None
    world_size: int | None
    shuffle: bool
    shuffle_seed: int
    drop_last: bool
    prefetch: int | None
    stride: int | None
    next_token: bool
    fields: Sequence[str] | None
    samples_per_epoch: int | None
    collate_fn: Collate | None


DatasetBuilder = Callable[[Any, LoaderOptions], BatchIterableDataset]
_BUILDERS: dict[str, DatasetBuilder] = {}


def register_storage_kind(kind: str, builder: DatasetBuilder, *, replace: bool = False) -> None:
    """Serve storages whose ``kind`` attribute equals ``kind`` with ``builder``.

    Parameters
    ----------
    kind : str
        Value of the storage's ``kind`` attribute.
    builder : callable
        ``builder(storage, options) -> BatchIterableDataset``; must raise
        :class:`~rangestream.errors.LoaderConfigError` for options that do not apply.
    replace : bool, default False
        Allow replacing an existing registration (otherwise an error, to catch clashes).
    """
    if kind in _BUILDERS and not replace:
        raise LoaderConfigError(f"storage kind {kind!r} is already registered")
    _BUILDERS[kind] = builder


def registered_kinds() -> list[str]:
    """Registered storage kinds, sorted."""
    return sorted(_BUILDERS)


def storage_kind(storage: Any) -> str:
    """The registered kind of ``storage``, read from its ``kind`` attribute."""
    kind = getattr(storage, "kind", None)
    if kind not in _BUILDERS:
        raise LoaderConfigError(
            f"{type(storage).__name__} has kind={kind!r}; the loader serves storages whose "
            f"`kind` attribute is one of {registered_kinds()}"
        )
    return str(kind)


def build_dataset(storage: Any, options: LoaderOptions) -> BatchIterableDataset:
    """Build the iterable dataset for ``storage`` according to its kind."""
    return _BUILDERS[storage_kind(storage)](storage, options)


def _reject(kind: str, **given: object) -> None:
    unused = sorted(name for name, value in given.items() if value not in (None, False))
    if unused:
        raise LoaderConfigError(f"{', '.join(unused)} do(es) not apply to {kind!r} storage")


def _require_length(kind: str, options: LoaderOptions, meaning: str) -> int:
    if options.sequence_length is None:
        raise LoaderConfigError(f"{kind!r} storage needs sequence_length ({meaning})")
    return options.sequence_length


def _indexed(dataset: Any, options: LoaderOptions) -> IndexedBatchDataset:
    return IndexedBatchDataset(
        dataset,
        batch_size=options.batch_size,
        shuffle=options.shuffle,
        seed=options.shuffle_seed,
        rank=options.rank,
        world_size=options.world_size,
        drop_last=options.drop_last,
        prefetch=options.prefetch,
        collate_fn=options.collate_fn,
    )


def _stream_builder(kind: str) -> DatasetBuilder:
    def build(storage: Any, options: LoaderOptions) -> BatchIterableDataset:
        _reject(kind, fields=options.fields, samples_per_epoch=options.samples_per_epoch)
        length = _require_length(kind, options, "elements per window")
        from rangestream.dataset import StreamDataset

        windows = StreamDataset(
            storage, length, stride=options.stride, next_token=options.next_token
        )
        return _indexed(windows, options)

    return build


def _document_builder(storage: Any, options: LoaderOptions) -> BatchIterableDataset:
    _reject(
        "document",
        sequence_length=options.sequence_length,
        stride=options.stride,
        next_token=options.next_token,
        fields=options.fields,
        samples_per_epoch=options.samples_per_epoch,
    )
    from rangestream.dataset import DocumentDataset

    return _indexed(DocumentDataset(storage), options)


def _temporal_builder(storage: Any, options: LoaderOptions) -> BatchIterableDataset:
    _reject("temporal", stride=options.stride, next_token=options.next_token)
    if not options.shuffle:
        raise LoaderConfigError(
            "'temporal' storage draws windows at random; shuffle=False has no meaning there"
        )
    frames = _require_length("temporal", options, "frames per window")
    return TemporalBatchDataset(
        storage,
        frames,
        fields=options.fields,
        batch_size=options.batch_size,
        seed=options.shuffle_seed,
        rank=options.rank,
        world_size=options.world_size,
        samples_per_epoch=options.samples_per_epoch,
        drop_last=options.drop_last,
        prefetch=options.prefetch,
        collate_fn=options.collate_fn,
    )


register_storage_kind("stream", _stream_builder("stream"))
register_storage_kind("stream_with_meta", _stream_builder("stream_with_meta"))
register_storage_kind("document", _document_builder)
register_storage_kind("temporal", _temporal_builder)
