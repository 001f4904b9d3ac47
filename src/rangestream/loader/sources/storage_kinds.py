"""Which sample source serves which kind of storage.

``StatefulDataLoader.from_storage`` dispatches on ``storage.kind``, a string attribute every
storage class carries:

========================  ====================================================================
``"stream"``              ``StreamStorage``: windows of ``sequence_length`` elements
``"stream_with_meta"``    ``StreamWithMetaStorage``: the same windows, with their payloads
``"document"``            ``DocumentStorage``: one document per sample
``"temporal"``            ``TemporalArrayStorage``: random windows of ``sequence_length`` frames
``"temporal_records"``    ``TemporalRecords``: whole records (by index, in order or shuffled),
                          or random windows of its records with ``sequence_length``
========================  ====================================================================

Duck typing on one attribute keeps this layer free of imports from ``storage/`` (data flows
loader -> dataset -> storage, and the loader needs only the dataset classes). A new storage
kind registers a builder with :func:`register_storage_kind`: a function from the storage and
its :class:`SourceOptions` to a :class:`~rangestream.loader.sources.protocol.SampleSource`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from rangestream.errors import LoaderConfigError
from rangestream.loader.sources.indexed import IndexedSource
from rangestream.loader.sources.protocol import SampleSource, Shuffle
from rangestream.loader.sources.temporal import TemporalWindowSource

__all__ = [
    "SourceBuilder",
    "SourceOptions",
    "build_source",
    "default_shuffle",
    "register_storage_kind",
    "registered_kinds",
    "storage_kind",
]


@dataclass(frozen=True)
class SourceOptions:
    """What is read from one storage, and in which order (the sample side of
    ``from_storage``; the batch side is :class:`~rangestream.loader.options.BatchOptions`).

    ``shuffle=None`` takes the storage's default (:func:`default_shuffle`); options that a
    kind does not use must be left unset (``None`` or ``False``) or its builder refuses
    them.
    """

    sequence_length: int | None = None
    shuffle: str | bool | None = None
    seed: int = 0
    stride: int | None = None
    next_token: bool = False
    fields: Sequence[str] | None = None
    samples_per_epoch: int | None = None
    run_windows: int | None = None
    buffer_runs: int | None = None
    boundaries: bool = False
    keys: Sequence[str] | None = None
    token_dtype: str | None = "int64"

    def with_values(self, values: dict[str, Any]) -> SourceOptions:
        """These options with ``values`` replacing some (names checked)."""
        known = {item.name for item in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise LoaderConfigError(f"unknown source option(s) {unknown}; known {sorted(known)}")
        return replace(self, **values)


SourceBuilder = Callable[[Any, SourceOptions], SampleSource]
_BUILDERS: dict[str, SourceBuilder] = {}


def register_storage_kind(kind: str, builder: SourceBuilder, *, replace: bool = False) -> None:
    """Serve storages whose ``kind`` attribute equals ``kind`` with ``builder``.

    Parameters
    ----------
    kind : str
        Value of the storage's ``kind`` attribute.
    builder : callable
        ``builder(storage, options) -> SampleSource``; must raise
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


def build_source(storage: Any, options: SourceOptions) -> SampleSource:
    """The sample source for ``storage`` according to its kind."""
    return _BUILDERS[storage_kind(storage)](storage, options)


def default_shuffle(storage: Any) -> str:
    """The shuffle a storage gets by default: ``"window"`` on local disk, else ``"block"``.

    Over object storage a per-window shuffle costs one billed range request per window and
    the server's request rate caps the loader; the block shuffle reads runs of about 4 MiB
    (``docs/design.md``, "The loader's shuffles and mixtures"). On local disk a random
    window is a page-cache copy, and the per-window shuffle's batches are as mixed as an
    ideal shuffle's.
    """
    order = Shuffle.WINDOW if getattr(storage, "is_local", False) else Shuffle.BLOCK
    return str(order.mode)


def _reject(kind: str, **given: object) -> None:
    unused = sorted(name for name, value in given.items() if value not in (None, False))
    if unused:
        raise LoaderConfigError(f"{', '.join(unused)} do(es) not apply to {kind!r} storage")


def _require_length(kind: str, options: SourceOptions, meaning: str) -> int:
    if options.sequence_length is None:
        raise LoaderConfigError(f"{kind!r} storage needs sequence_length ({meaning})")
    return options.sequence_length


def _indexed(
    dataset: Any, options: SourceOptions, shuffle: str | bool, *, tokens: bool = True
) -> IndexedSource:
    """An indexed source; ``tokens``: its integers are token ids, cast to
    ``options.token_dtype`` (not so for temporal records, whose integers are pixels)."""
    return IndexedSource(
        dataset,
        shuffle=shuffle,
        seed=options.seed,
        run_windows=options.run_windows,
        buffer_runs=options.buffer_runs,
        token_dtype=options.token_dtype if tokens else None,
    )


def _stream_builder(kind: str) -> SourceBuilder:
    def build(storage: Any, options: SourceOptions) -> SampleSource:
        _reject(
            kind,
            fields=options.fields,
            samples_per_epoch=options.samples_per_epoch,
            keys=options.keys,
        )
        length = _require_length(kind, options, "elements per window")
        from rangestream.dataset import StreamDataset

        windows = StreamDataset(
            storage,
            length,
            stride=options.stride,
            next_token=options.next_token,
            boundaries=options.boundaries,
        )
        shuffle = default_shuffle(storage) if options.shuffle is None else options.shuffle
        return _indexed(windows, options, shuffle)

    return build


def _temporal_records_shuffle(options: SourceOptions, why: str) -> str | bool:
    """The shuffle of whole temporal records: by record unless told otherwise; records
    are few and large, so there are no runs of them for ``"block"`` to read."""
    if options.shuffle is not None and Shuffle.parse(options.shuffle) is Shuffle.BLOCK:
        raise LoaderConfigError(
            f"{why}; shuffle='block' reads runs of many small samples: use "
            "shuffle='window' (the default) or False"
        )
    return "window" if options.shuffle is None else options.shuffle


def _document_builder(storage: Any, options: SourceOptions) -> SampleSource:
    """Documents, by default block-shuffled over object storage (runs of about 4 MiB of
    consecutive documents: two requests a run instead of about two a document) and
    shuffled by document on local disk, as windows are (:func:`default_shuffle`)."""
    _reject(
        "document",
        sequence_length=options.sequence_length,
        stride=options.stride,
        next_token=options.next_token,
        fields=options.fields,
        samples_per_epoch=options.samples_per_epoch,
        boundaries=options.boundaries,
    )
    shuffle = default_shuffle(storage) if options.shuffle is None else options.shuffle
    from rangestream.dataset import DocumentDataset

    return _indexed(DocumentDataset(storage, keys=options.keys), options, shuffle)


def _temporal_builder(storage: Any, options: SourceOptions) -> SampleSource:
    _reject(
        "temporal",
        boundaries=options.boundaries,
        keys=options.keys,
        stride=options.stride,
        next_token=options.next_token,
        run_windows=options.run_windows,
        buffer_runs=options.buffer_runs,
    )
    if options.shuffle is not None and Shuffle.parse(options.shuffle) is not Shuffle.WINDOW:
        raise LoaderConfigError(
            "'temporal' storage draws windows at random; shuffle=False or 'block' has no "
            "meaning there (for whole records in order, load TemporalRecords(storage))"
        )
    frames = _require_length(
        "temporal", options, "frames per window; for whole records load TemporalRecords(storage)"
    )
    return TemporalWindowSource(
        storage,
        frames,
        fields=options.fields,
        seed=options.seed,
        samples_per_epoch=options.samples_per_epoch,
    )


def _temporal_records_builder(records: Any, options: SourceOptions) -> SampleSource:
    """``TemporalRecords``: whole records (in order, or shuffled per epoch), or random
    windows of its records when ``sequence_length`` is given."""
    if options.sequence_length is not None:
        return _temporal_builder(records, options)
    _reject(
        "temporal_records",
        boundaries=options.boundaries,
        keys=options.keys,
        stride=options.stride,
        next_token=options.next_token,
        samples_per_epoch=options.samples_per_epoch,
        run_windows=options.run_windows,
        buffer_runs=options.buffer_runs,
    )
    shuffle = _temporal_records_shuffle(options, "whole temporal records are few and large")
    if options.fields is not None:
        records = records.with_fields(options.fields)
    return _indexed(records, options, shuffle, tokens=False)


register_storage_kind("stream", _stream_builder("stream"))
register_storage_kind("stream_with_meta", _stream_builder("stream_with_meta"))
register_storage_kind("document", _document_builder)
register_storage_kind("temporal", _temporal_builder)
register_storage_kind("temporal_records", _temporal_records_builder)
