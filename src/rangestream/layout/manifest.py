"""The dataset manifest: the group attributes that make a dataset exist.

``<dataset>/zarr.json`` is a Zarr v3 group whose ``attributes.rangestream`` names the kind
of storage, the format schema, the layout of each array and the shards. It is written last,
by the commit; before that the dataset does not exist for readers.

What the root says about shards depends on how many there are (format version 2). Up to
``INLINE_SHARDS`` it lists every shard's id and array lengths, so a small dataset opens with
one request. Beyond, it holds their count and totals, and the per-shard rows live in one
binary index array (``index/shards``: 8 bytes per shard and array, read at open with one more
request per 4 MiB) instead of a JSON list parsed number by number: 10^5 shards open in
milliseconds and a few megabytes instead of 157 ms and 41 MB. An array that fits in one
block is stored as one block of its own size (``ArrayLayout.stored_for``). ``inherited``
names the shards of an appended version whose data lies under an earlier commit's prefix.
Version 1 roots (every shard listed whatever the count, full blocks, no inherited shards)
are still read.

Everything here is parsed as untrusted input: bounded sizes, exact types, no pickle, and
keys that cannot leave the dataset prefix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator
from typing import Any

import numpy as np

from rangestream.errors import CorruptDataError, MetadataError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import dtype_from_json
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.layout.zarr_json import group_document

#: The version written: the shard table, short single blocks and inherited shards. Version
#: 1 (every shard listed in the root, full blocks, no inherited shards) is read too.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
#: Up to this many shards the root lists them (one request opens the dataset); beyond, the
#: per-shard rows are read from ``index/shards`` (one more request per 4 MiB of them).
INLINE_SHARDS = 1024
#: Where the per-shard rows are, under the version's data prefix.
SHARD_TABLE = "index/shards"
SHARD_ID_COLUMN = "shard_id"
ROOT_KEY = "zarr.json"
MAX_ROOT_BYTES = 512 * 1024 * 1024
MAX_SHARDS = 1 << 24
#: Bound on the rows of one array over all shards: cumulative sums stay far inside int64.
MAX_TOTAL_ROWS = 1 << 60
_COMMIT_ID = re.compile(r"^[0-9a-f]{32}$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_INT64 = np.dtype("<i8")
_UINT8 = np.dtype("u1")
#: Arrays whose rows readers reinterpret (``view``) with a fixed dtype, in the kinds whose
#: arrays docs/format.md defines; a stored layout must match or the view would fail or lie.
#: ``None`` stands for the schema's ``stream_dtype``. Other kinds check their own arrays.
_VIEWED_ARRAYS: dict[str, dict[str, np.dtype[Any] | None]] = {
    "stream": {"stream": None, "record_ends": _INT64},
    "stream_with_meta": {"stream": None, "record_ends": _INT64, "payload_heap": _UINT8},
    "document": {"payload_heap": _UINT8, "payload_offsets": _INT64},
}


def data_prefix(commit_id: str) -> str:
    return f"data/{commit_id}"


def shard_prefix(commit_id: str, shard: int) -> str:
    return f"{data_prefix(commit_id)}/shards/{shard}"


def array_key(commit_id: str, shard: int, name: str) -> str:
    return f"{shard_prefix(commit_id, shard)}/{name}"


def shard_table_layout(arrays: int) -> ArrayLayout:
    """The layout of ``index/shards`` for a kind with ``arrays`` arrays: int64 rows of
    ``(shard id, rows of each array)``, 64 KiB inner chunks, 4 MiB blocks."""
    return ArrayLayout.for_sizes(
        np.dtype("<i8"), (1 + arrays,), chunk_bytes=64 * 1024, block_bytes=4 * 1024 * 1024
    )


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
            _check_ids(ids, where)
            lengths = {name: rows[:, 1 + i] for i, name in enumerate(self.arrays)}
            for name, values in lengths.items():
                _check_lengths(values, name, where)
                total = int(np.sum(values, dtype=np.int64))
                if total != self.totals[name]:
                    raise MetadataError(
                        f"{where}: {name} lengths add up to {total}, the root says "
                        f"{self.totals[name]}"
                    )
            _check_inherited_shards(self.inherited, ids, where)
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
        if self.num_shards <= INLINE_SHARDS:
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


def parse_root(raw: bytes, where: str, expected_kind: str | None = None) -> Manifest:
    """Parse ``zarr.json`` of a dataset root into a manifest, refusing anything malformed."""
    if len(raw) > MAX_ROOT_BYTES:
        raise MetadataError(f"{where}: {len(raw)} bytes is too large for dataset metadata")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise MetadataError(f"{where} is not valid JSON: {error}") from error
    if not isinstance(document, dict):
        raise MetadataError(f"{where} must hold a JSON object")
    if document.get("zarr_format") != 3 or document.get("node_type") != "group":
        raise MetadataError(f"{where} is not a Zarr v3 group document")
    attributes = document.get("attributes")
    if not isinstance(attributes, dict) or "rangestream" not in attributes:
        raise MetadataError(f"{where} is a Zarr group but not a rangestream dataset")
    return parse_attributes(attributes["rangestream"], where, expected_kind)


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise MetadataError(f"{where}: {message}")


def parse_attributes(value: Any, where: str, expected_kind: str | None = None) -> Manifest:
    _require(isinstance(value, dict), where, "rangestream attributes must be an object")
    version = value.get("format_version")
    if version not in READ_VERSIONS or type(version) is not int:
        newer = type(version) is int and version > FORMAT_VERSION
        raise MetadataError(
            f"{where}: format_version {version!r} is not supported (this library reads "
            f"versions {', '.join(map(str, READ_VERSIONS))})"
            + ("; it was written by a newer rangestream: upgrade the library" if newer else "")
        )
    kind = value.get("kind")
    _require(isinstance(kind, str) and bool(_NAME.match(kind)), where, f"bad kind {kind!r}")
    if expected_kind is not None and kind != expected_kind:
        from rangestream.errors import SchemaMismatchError

        raise SchemaMismatchError(
            f"{where} holds a {kind!r} dataset, but it was opened as {expected_kind!r}"
        )
    commit_id = value.get("commit_id")
    _require(
        isinstance(commit_id, str) and bool(_COMMIT_ID.match(commit_id)),
        where,
        f"commit_id {commit_id!r} is not 32 hex digits",
    )
    _require(
        value.get("data_prefix") == data_prefix(commit_id),
        where,
        "data_prefix does not match the commit id (keys must stay inside the dataset)",
    )
    schema = value.get("schema")
    _require(isinstance(schema, dict), where, "schema must be an object")
    arrays_json = value.get("arrays")
    _require(isinstance(arrays_json, dict) and len(arrays_json) <= 64, where, "bad arrays")
    arrays: dict[str, ArrayLayout] = {}
    for name, layout_json in arrays_json.items():
        _require(isinstance(name, str) and bool(_NAME.match(name)), where, f"bad name {name!r}")
        _require(name != SHARD_ID_COLUMN, where, f"an array may not be named {name!r}")
        arrays[name] = ArrayLayout.from_json(layout_json, f"{where} array {name!r}")
    shards = value.get("shards")
    _require(isinstance(shards, dict), where, "shards must be an object")
    _check_viewed_arrays(kind, schema, arrays, where)
    extra = value.get("extra", {})
    _require(isinstance(extra, dict), where, "extra must be an object")
    previous = extra.get("previous_commit_id")
    # a writer that replaces this version deletes data/<previous>: it must name a version
    _require(
        previous is None
        or (
            isinstance(previous, str) and bool(_COMMIT_ID.match(previous)) and previous != commit_id
        ),
        where,
        f"extra.previous_commit_id {previous!r} is not the 32 hex digits of an earlier commit",
    )
    previous_inherited = extra.get("previous_inherited", [])
    _require(
        isinstance(previous_inherited, list)
        and len(previous_inherited) <= MAX_SHARDS
        and all(isinstance(c, str) and _COMMIT_ID.match(c) for c in previous_inherited),
        where,
        "extra.previous_inherited must be a list of commit ids",
    )
    inherited = _inherited(value.get("inherited"), version, commit_id, where)
    if version == 1 or "ids" in shards:
        shard_ids, lengths = _inline_shards(shards, arrays, where)
        _check_inherited_shards(inherited, shard_ids, where)
        if version > 1:
            count = shards.get("count")
            _require(
                type(count) is int and count == len(shard_ids),
                where,
                f"shards.count {count!r} differs from the {len(shard_ids)} shard ids listed",
            )
        return Manifest(
            kind,
            commit_id,
            schema,
            arrays,
            shard_ids,
            lengths,
            extra,
            inherited,
            format_version=version,
        )
    count, totals, table_layout = _table_shards(shards, arrays, where)
    return Manifest(
        kind,
        commit_id,
        schema,
        arrays,
        None,
        None,
        extra,
        inherited,
        num_shards=count,
        totals=totals,
        table_layout=table_layout,
        format_version=version,
    )


def _inline_shards(
    shards: dict[str, Any], arrays: dict[str, ArrayLayout], where: str
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Shard ids and lengths listed in the root (version 1, and small version 2 datasets)."""
    ids = _int_list(shards.get("ids"), f"{where} shard ids")
    _require(len(ids) <= MAX_SHARDS, where, "too many shards")
    shard_ids = np.asarray(ids, dtype=np.int64)
    _check_ids(shard_ids, where)
    lengths_json = shards.get("lengths")
    _require(isinstance(lengths_json, dict), where, "shard lengths must be an object")
    _require(set(lengths_json) == set(arrays), where, "shard lengths must name every array")
    lengths = {}
    for name in arrays:
        values = np.asarray(_int_list(lengths_json[name], f"{where} {name} lengths"), np.int64)
        _require(len(values) == len(shard_ids), where, f"{name} lengths do not match shard ids")
        _check_lengths(values, name, where)
        lengths[name] = values
    return shard_ids, lengths


def _table_shards(
    shards: dict[str, Any], arrays: dict[str, ArrayLayout], where: str
) -> tuple[int, dict[str, int], ArrayLayout]:
    """Count and totals of shards whose rows are in ``index/shards``; its form is checked."""
    count = shards.get("count")
    _require(
        type(count) is int and INLINE_SHARDS < count <= MAX_SHARDS,
        where,
        f"shards.count {count!r} must be an integer in ({INLINE_SHARDS}, {MAX_SHARDS}] "
        "when the shards are not listed",
    )
    columns = shards.get("columns")
    expected = [SHARD_ID_COLUMN, *arrays]
    _require(
        columns == expected,
        where,
        f"shards.columns {columns!r} must be {expected} (the shard id, then every array)",
    )
    layout = ArrayLayout.from_json(shards.get("table"), f"{where} shards.table")
    _require(
        layout.dtype == np.dtype("<i8") and layout.row_shape == (len(expected),),
        where,
        f"shards.table must hold int64 rows of {len(expected)} columns",
    )
    totals = shards.get("totals")
    _require(isinstance(totals, dict) and set(totals) == set(arrays), where, "bad shards.totals")
    for name, total in totals.items():
        _require(
            type(total) is int and 0 <= total < MAX_TOTAL_ROWS,
            where,
            f"shards.totals[{name!r}] {total!r} is out of range",
        )
    return count, {name: totals[name] for name in arrays}, layout


def _inherited(value: Any, version: int, commit_id: str, where: str) -> dict[str, list[int]]:
    """``inherited``: earlier commits and the shards of this version under their prefixes.

    Untrusted: each commit id is 32 hex digits other than this version's (keys stay inside
    the dataset), and each shard belongs to one commit only; that they are shards of this
    version is checked once the shard ids are known (``_check_inherited_shards``).
    """
    if value is None:
        return {}
    _require(version >= 2, where, "inherited shards need format_version 2")
    _require(isinstance(value, dict) and len(value) <= MAX_SHARDS, where, "bad inherited")
    seen: set[int] = set()
    out: dict[str, list[int]] = {}
    for commit, shards in value.items():
        _require(
            isinstance(commit, str) and bool(_COMMIT_ID.match(commit)) and commit != commit_id,
            where,
            f"inherited commit {commit!r:.80} is not the 32 hex digits of an earlier commit",
        )
        listed = _int_list(shards, f"{where} inherited shards of {commit}")
        _require(
            not seen & set(listed) and len(set(listed)) == len(listed),
            where,
            f"inherited shards of {commit} must be distinct shards of this version",
        )
        seen.update(listed)
        out[commit] = listed
    return out


def _check_inherited_shards(
    inherited: dict[str, list[int]], shard_ids: np.ndarray, where: str
) -> None:
    for commit, listed in inherited.items():
        _require(
            bool(np.isin(np.asarray(listed, dtype=np.int64), shard_ids).all()),
            where,
            f"inherited shards of {commit} must be distinct shards of this version",
        )


def _check_ids(shard_ids: np.ndarray, where: str) -> None:
    _require(bool((shard_ids >= 0).all()), where, "shard ids must be non-negative")
    _require(bool((np.diff(shard_ids) > 0).all()), where, "shard ids must be strictly increasing")


def _check_lengths(values: np.ndarray, name: str, where: str) -> None:
    _require(bool((values >= 0).all()), where, f"{name} lengths must be non-negative")
    _require(bool((values < 1 << 50).all()), where, f"{name} lengths are out of range")
    _require(
        float(values.sum(dtype=np.float64)) < MAX_TOTAL_ROWS,
        where,
        f"{name} lengths add up to more than {MAX_TOTAL_ROWS} rows",
    )


def _check_viewed_arrays(
    kind: str, schema: dict[str, Any], arrays: dict[str, ArrayLayout], where: str
) -> None:
    """Refuse layouts that differ from the dtype and row shape the kind's readers view."""
    for name, dtype in _VIEWED_ARRAYS.get(kind, {}).items():
        layout = arrays.get(name)
        if layout is None:
            continue  # a missing array is the storage's SchemaMismatchError to raise
        if dtype is None:
            dtype = dtype_from_json(schema.get("stream_dtype"), f"{where} schema stream_dtype")
        _require(
            layout.dtype == dtype and layout.row_shape == (),
            where,
            f"array {name!r} is stored as {layout.dtype} rows of shape {layout.row_shape}, "
            f"but a {kind!r} dataset has {dtype} elements there",
        )


def _int_list(value: Any, where: str) -> list[int]:
    """``value`` if it is a list of integers that fit in int64 (numpy would overflow)."""
    if not isinstance(value, list) or not all(
        type(item) is int and -(1 << 63) <= item < 1 << 63 for item in value
    ):
        raise MetadataError(f"{where} must be a list of 64-bit integers")
    return value
