"""The dataset manifest: the group attributes that make a dataset exist.

``<dataset>/zarr.json`` is a Zarr v3 group whose ``attributes.rangestream`` names the kind
of storage, the format schema, the layout of each array and the shards. It is written last,
by the commit; before that the dataset does not exist for readers.

What the root says about shards depends on how many there are (format version 2): it
lists them, or holds their count and totals while their rows live in the shard table
(``shard_table``). An array that fits in one block is stored as one block of its own size
(``ArrayLayout.stored_for``). ``inherited`` names the shards of an appended version whose
data lies under an earlier commit's prefix. Version 1 roots (every shard listed whatever
the count, full blocks, no inherited shards) are still read (``manifest_parsing``, which
treats every root as untrusted input).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from rangestream.errors import CorruptDataError, MetadataError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.manifest_checks import check_ids, check_inherited_shards, check_lengths
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.layout.shard_table import (
    SHARD_ID_COLUMN,
    SHARD_TABLE,
    lists_shards,
    shard_table_layout,
)
from rangestream.layout.zarr_json import group_document

#: The version written: the shard table, short single blocks and inherited shards. Version
#: 1 (every shard listed in the root, full blocks, no inherited shards) is read too.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
ROOT_KEY = "zarr.json"
MAX_ROOT_BYTES = 512 * 1024 * 1024


def data_prefix(commit_id: str) -> str:
    return f"data/{commit_id}"


def shard_prefix(commit_id: str, shard: int) -> str:
    return f"{data_prefix(commit_id)}/shards/{shard}"


def array_key(commit_id: str, shard: int, name: str) -> str:
    return f"{shard_prefix(commit_id, shard)}/{name}"


class Manifest:
    """What a committed dataset is: kind, schema, array layouts and its shards.

    ``shard_ids`` and ``lengths`` (one int64 array per array name, by shard position) are
    what readers plan with. A root that keeps them in ``index/shards`` is parsed with them
    still to read (``complete`` is false): ``read_shard_table`` reads them; ``num_shards``
    and ``totals`` are known either way.

    ``inherited`` maps an earlier commit id to the shards of this version whose data was
    written under that commit's prefix (an append adds shards without copying the old
    ones); every other shard lies under this version's own prefix.
    """

    def __init__(
        self,
        kind: str,
        commit_id: str,
        schema: dict[str, Any],
        arrays: dict[str, ArrayLayout],
        shard_ids: np.ndarray | None,
        lengths: dict[str, np.ndarray] | None,
        extra: dict[str, Any] | None = None,
        inherited: dict[str, list[int]] | None = None,
        *,
        num_shards: int | None = None,
        totals: dict[str, int] | None = None,
        table_layout: ArrayLayout | None = None,
        format_version: int = FORMAT_VERSION,
    ) -> None:
        self.kind = kind
        self.commit_id = commit_id
        self.schema = schema
        self.arrays = arrays
        self.extra = {} if extra is None else extra
        self.inherited = {} if inherited is None else inherited
        self._shard_commits = {
            int(shard): commit for commit, shards in self.inherited.items() for shard in shards
        }
        self.format_version = format_version
        self._shard_ids = shard_ids
        self._lengths = lengths
        if shard_ids is not None and lengths is not None:
            num_shards = len(shard_ids)
            totals = {name: int(np.sum(values, dtype=np.int64)) for name, values in lengths.items()}
        if num_shards is None or totals is None:
            raise ValueError("a manifest needs its shards, or their count and totals")
        self.num_shards = num_shards
        self.totals = totals
        self.table_layout = table_layout or shard_table_layout(len(arrays))

    def __repr__(self) -> str:
        return (
            f"Manifest(kind={self.kind!r}, commit_id={self.commit_id!r}, "
            f"shards={self.num_shards}, complete={self.complete})"
        )

    @property
    def complete(self) -> bool:
        """Whether the per-shard ids and lengths are known (else: ``read_shard_table``)."""
        return self._shard_ids is not None

    @property
    def shard_ids(self) -> np.ndarray:
        """Shard ids, strictly increasing (int64, by shard position)."""
        if self._shard_ids is None:
            raise MetadataError(f"{self._where()}: the shard table has not been read yet")
        return self._shard_ids

    @property
    def lengths(self) -> dict[str, np.ndarray]:
        """Rows of each array in each shard (int64, by shard position)."""
        if self._lengths is None:
            raise MetadataError(f"{self._where()}: the shard table has not been read yet")
        return self._lengths

    def _where(self) -> str:
        return f"dataset version {self.commit_id}"

    def shard_commit(self, shard: int) -> str:
        """The commit under whose prefix ``shard``'s data lies."""
        return self._shard_commits.get(shard, self.commit_id)

    @property
    def commits(self) -> list[str]:
        """Every commit whose prefix this version reads: its own, then the inherited."""
        return [self.commit_id, *self.inherited]

    def array_key(self, shard: int, name: str) -> str:
        return array_key(self.shard_commit(shard), shard, name)

    def stored_layout(self, name: str, length: int) -> ArrayLayout:
        """The layout array ``name`` of ``length`` rows is stored with: the manifest's, or,
        from version 2 on, one block of its own size if it fits in one
        (``ArrayLayout.stored_for``)."""
        layout = self.arrays[name]
        return layout if self.format_version < 2 else layout.stored_for(length)

    @property
    def table_columns(self) -> list[str]:
        """Columns of ``index/shards``: the shard id, then each array's rows."""
        return [SHARD_ID_COLUMN, *self.arrays]

    @property
    def table_key(self) -> str:
        return f"{data_prefix(self.commit_id)}/{SHARD_TABLE}"

    def table_rows(self) -> np.ndarray:
        """The rows of ``index/shards``: ``(shard id, rows of each array)`` per shard."""
        columns = [self.shard_ids, *(self.lengths[name] for name in self.arrays)]
        return np.ascontiguousarray(np.stack(columns, axis=1), dtype="<i8").reshape(
            self.num_shards, 1 + len(self.arrays)
        )

    def with_table(self, rows: np.ndarray, where: str) -> Manifest:
        """This manifest completed with the rows read from ``index/shards``.

        The rows are checked as the root's lists are (ids strictly increasing and
        non-negative, lengths in range) and against the root's totals, so a damaged or
        foreign table is refused (``CorruptDataError``) before any read plans with it.
        """
        columns = 1 + len(self.arrays)
        if rows.shape != (self.num_shards, columns):
            raise CorruptDataError(
                f"{where}: the shard table holds {rows.shape} values, the root says "
                f"{self.num_shards} shards of {columns} columns"
            )
        ids = rows[:, 0]
        try:
            check_ids(ids, where)
            lengths = {name: rows[:, 1 + i] for i, name in enumerate(self.arrays)}
            for name, values in lengths.items():
                check_lengths(values, name, where)
                total = int(np.sum(values, dtype=np.int64))
                if total != self.totals[name]:
                    raise MetadataError(
                        f"{where}: {name} lengths add up to {total}, the root says "
                        f"{self.totals[name]}"
                    )
            check_inherited_shards(self.inherited, ids, where)
        except MetadataError as error:
            raise CorruptDataError(str(error)) from error
        return Manifest(
            self.kind,
            self.commit_id,
            self.schema,
            self.arrays,
            ids,
            lengths,
            self.extra,
            self.inherited,
            table_layout=self.table_layout,
            format_version=self.format_version,
        )

    def to_attributes(self) -> dict[str, Any]:
        shards: dict[str, Any] = {"count": self.num_shards}
        if lists_shards(self.num_shards):
            shards["ids"] = [int(s) for s in self.shard_ids]
            shards["lengths"] = {
                name: [int(n) for n in values] for name, values in self.lengths.items()
            }
        else:
            shards["totals"] = dict(self.totals)
            shards["columns"] = self.table_columns
            shards["table"] = self.table_layout.to_json()
        attributes = {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "commit_id": self.commit_id,
            "data_prefix": data_prefix(self.commit_id),
            "schema": self.schema,
            "arrays": {name: layout.to_json() for name, layout in self.arrays.items()},
            "shards": shards,
            "extra": self.extra,
        }
        if self.inherited:
            attributes["inherited"] = {c: sorted(shards) for c, shards in self.inherited.items()}
        return attributes

    def root_document(self) -> dict[str, Any]:
        return group_document({"rangestream": self.to_attributes()})


def read_shard_table(
    manifest: Manifest, describe: Any = str
) -> Generator[list[RowRead], Any, Manifest]:
    """A read program (``layout.executors``) completing ``manifest`` from ``index/shards``.

    One row read of the whole table: one request per 4 MiB block of it, in one round, the
    rows checked (``Manifest.with_table``). A complete manifest is returned as it is.
    """
    if manifest.complete:
        return manifest
    count = manifest.num_shards
    array = StoredArray(manifest.table_key, manifest.table_layout, count, "shards")
    read = RowRead.whole(array, 0, count, np.dtype("<i8"))
    if count:
        yield [read]
        rows = read.target.reshape(count, -1)
    else:
        rows = np.empty((0, 1 + len(manifest.arrays)), dtype=np.int64)
    return manifest.with_table(rows, describe(manifest.table_key))
