"""The options of a storage, as small value objects validated once (httpx's ``Limits``).

Every storage kind takes the same keyword arguments (``max_concurrency=``, ``chunk_bytes=``,
...); they are gathered here when the storage is made, checked once, and passed whole to the
layers that use them, instead of being restated in every signature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rangestream.arguments import integer, positive_integer
from rangestream.io.cache.settings import parse_budget
from rangestream.io.range_reader import (
    DEFAULT_COALESCE_GAP,
    DEFAULT_MAX_COALESCED_BYTES,
    DEFAULT_MAX_CONCURRENCY,
)
from rangestream.io.retry import RetryPolicy

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_CHUNK_BYTES",
    "MAPPED_READS_ENV",
    "LayoutOptions",
    "ReadOptions",
]

#: Target size of one inner chunk: the unit of checksums and of over-fetch per window end.
DEFAULT_CHUNK_BYTES = 1024
#: Upper bound on one block (one stored object), its checksums and chunk index included.
DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024
#: Environment switch: ``0`` keeps local reads off memory maps (``ReadOptions.mapped``).
MAPPED_READS_ENV = "RANGESTREAM_MAPPED_READS"


def _mapped_default() -> bool:
    return os.environ.get(MAPPED_READS_ENV, "1").strip().lower() not in {"0", "false", "no"}


@dataclass(frozen=True)
class ReadOptions:
    """How a storage is read.

    Parameters
    ----------
    max_concurrency
        Requests in flight for one read call (a window, a ``read_many``).
    coalesce_gap
        Ranges of one object this close together are fetched as one request.
    max_coalesced_bytes
        Upper bound on one coalesced request.
    retry
        Retry policy for transient storage errors.
    verify_checksums
        Check each inner chunk's crc32c on every read (on by default).
    mapped
        On a local path, copy reads out of memory-mapped blocks (on by default; the
        environment variable ``RANGESTREAM_MAPPED_READS=0`` turns it off, for filesystems
        where mapping is unwise, such as some FUSE mounts): ``pread`` is used instead.
    cache_dir, cache_bytes
        A node-local byte cache of what reads fetch from a remote store (off by default;
        ``RANGESTREAM_CACHE_DIR`` and ``RANGESTREAM_CACHE_BYTES`` turn it on without code):
        a directory every process of the node may share, and its budget in bytes (or
        ``"20G"``). See ``rangestream.io.cache``.
    """

    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    coalesce_gap: int = DEFAULT_COALESCE_GAP
    max_coalesced_bytes: int = DEFAULT_MAX_COALESCED_BYTES
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    verify_checksums: bool = True
    mapped: bool = field(default_factory=_mapped_default)
    cache_dir: str | None = None
    cache_bytes: int | str | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_bytes is not None:
            object.__setattr__(self, "cache_bytes", parse_budget(self.cache_bytes))
        object.__setattr__(
            self, "max_concurrency", positive_integer(self.max_concurrency, "max_concurrency")
        )
        object.__setattr__(
            self, "coalesce_gap", integer(self.coalesce_gap, "coalesce_gap", minimum=0)
        )
        object.__setattr__(
            self,
            "max_coalesced_bytes",
            positive_integer(self.max_coalesced_bytes, "max_coalesced_bytes"),
        )
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {self.retry!r}")
        for name in ("verify_checksums", "mapped"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class LayoutOptions:
    """How new writes cut arrays into inner chunks and blocks (readers take the stored layout).

    Parameters
    ----------
    chunk_bytes, block_bytes
        Target sizes of inner chunks and of blocks (one stored object, its checksums and
        chunk index included).
    dense_chunks
        Record that blocks are laid out densely, so readers compute byte ranges without
        fetching chunk indexes; ``False`` makes readers fetch and cache each block's chunk
        index, as a generic Zarr reader does.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    block_bytes: int = DEFAULT_BLOCK_BYTES
    dense_chunks: bool = True

    def __post_init__(self) -> None:
        chunk = positive_integer(self.chunk_bytes, "chunk_bytes")
        block = positive_integer(self.block_bytes, "block_bytes")
        if block < chunk:
            raise ValueError(f"need chunk_bytes <= block_bytes, got {chunk} and {block}")
        object.__setattr__(self, "chunk_bytes", chunk)
        object.__setattr__(self, "block_bytes", block)
        if not isinstance(self.dense_chunks, bool):
            raise TypeError(f"dense_chunks must be True or False, got {self.dense_chunks!r}")


def split_options(
    options: dict[str, Any], layout_defaults: LayoutOptions
) -> tuple[ReadOptions, LayoutOptions, dict[str, Any]]:
    """The read and layout options named in ``options`` (keyword arguments of a storage),
    and what is left over (the storage kind's own arguments)."""
    rest = dict(options)
    read = rest.pop("read_options", None)
    if read is None:
        names = ReadOptions.__dataclass_fields__
        read = ReadOptions(**{name: rest.pop(name) for name in list(rest) if name in names})
    layout_names = LayoutOptions.__dataclass_fields__
    given = {name: rest.pop(name) for name in list(rest) if name in layout_names}
    layout = LayoutOptions(
        **{**{name: getattr(layout_defaults, name) for name in layout_names}, **given}
    )
    return read, layout, rest
