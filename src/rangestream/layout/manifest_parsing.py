"""Parsing a dataset's root document into a ``Manifest``, as untrusted input.

Bounded sizes, exact types, no pickle, and keys that cannot leave the dataset prefix:
whatever the store holds, a root either parses into a manifest readers can plan with or
is refused with a ``MetadataError`` naming what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rangestream.errors import MetadataError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import dtype_from_json
from rangestream.layout.manifest import (
    FORMAT_VERSION,
    MAX_ROOT_BYTES,
    READ_VERSIONS,
    Manifest,
    data_prefix,
)
from rangestream.layout.manifest_checks import (
    COMMIT_ID,
    MAX_SHARDS,
    NAME,
    check_ids,
    check_inherited_shards,
    check_lengths,
    int_list,
    require,
)
from rangestream.layout.shard_table import SHARD_ID_COLUMN, table_shards

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


def parse_attributes(value: Any, where: str, expected_kind: str | None = None) -> Manifest:
    require(isinstance(value, dict), where, "rangestream attributes must be an object")
    version = value.get("format_version")
    if version not in READ_VERSIONS or type(version) is not int:
        newer = type(version) is int and version > FORMAT_VERSION
        raise MetadataError(
            f"{where}: format_version {version!r} is not supported (this library reads "
            f"versions {', '.join(map(str, READ_VERSIONS))})"
            + ("; it was written by a newer rangestream: upgrade the library" if newer else "")
        )
    kind = value.get("kind")
    require(isinstance(kind, str) and bool(NAME.match(kind)), where, f"bad kind {kind!r}")
    if expected_kind is not None and kind != expected_kind:
        from rangestream.errors import SchemaMismatchError

        raise SchemaMismatchError(
            f"{where} holds a {kind!r} dataset, but it was opened as {expected_kind!r}"
        )
    commit_id = value.get("commit_id")
    require(
        isinstance(commit_id, str) and bool(COMMIT_ID.match(commit_id)),
        where,
        f"commit_id {commit_id!r} is not 32 hex digits",
    )
    require(
        value.get("data_prefix") == data_prefix(commit_id),
        where,
        "data_prefix does not match the commit id (keys must stay inside the dataset)",
    )
    schema = value.get("schema")
    require(isinstance(schema, dict), where, "schema must be an object")
    arrays_json = value.get("arrays")
    require(isinstance(arrays_json, dict) and len(arrays_json) <= 64, where, "bad arrays")
    arrays: dict[str, ArrayLayout] = {}
    for name, layout_json in arrays_json.items():
        require(isinstance(name, str) and bool(NAME.match(name)), where, f"bad name {name!r}")
        require(name != SHARD_ID_COLUMN, where, f"an array may not be named {name!r}")
        arrays[name] = ArrayLayout.from_json(layout_json, f"{where} array {name!r}")
    shards = value.get("shards")
    require(isinstance(shards, dict), where, "shards must be an object")
    _check_viewed_arrays(kind, schema, arrays, where)
    extra = value.get("extra", {})
    require(isinstance(extra, dict), where, "extra must be an object")
    previous = extra.get("previous_commit_id")
    # a writer that replaces this version deletes data/<previous>: it must name a version
    require(
        previous is None
        or (
            isinstance(previous, str) and bool(COMMIT_ID.match(previous)) and previous != commit_id
        ),
        where,
        f"extra.previous_commit_id {previous!r} is not the 32 hex digits of an earlier commit",
    )
    previous_inherited = extra.get("previous_inherited", [])
    require(
        isinstance(previous_inherited, list)
        and len(previous_inherited) <= MAX_SHARDS
        and all(isinstance(c, str) and COMMIT_ID.match(c) for c in previous_inherited),
        where,
        "extra.previous_inherited must be a list of commit ids",
    )
    inherited = _inherited(value.get("inherited"), version, commit_id, where)
    if version == 1 or "ids" in shards:
        shard_ids, lengths = _inline_shards(shards, arrays, where)
        check_inherited_shards(inherited, shard_ids, where)
        if version > 1:
            count = shards.get("count")
            require(
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
    count, totals, table_layout = table_shards(shards, arrays, where)
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
    ids = int_list(shards.get("ids"), f"{where} shard ids")
    require(len(ids) <= MAX_SHARDS, where, "too many shards")
    shard_ids = np.asarray(ids, dtype=np.int64)
    check_ids(shard_ids, where)
    lengths_json = shards.get("lengths")
    require(isinstance(lengths_json, dict), where, "shard lengths must be an object")
    require(set(lengths_json) == set(arrays), where, "shard lengths must name every array")
    lengths = {}
    for name in arrays:
        values = np.asarray(int_list(lengths_json[name], f"{where} {name} lengths"), np.int64)
        require(len(values) == len(shard_ids), where, f"{name} lengths do not match shard ids")
        check_lengths(values, name, where)
        lengths[name] = values
    return shard_ids, lengths


def _inherited(value: Any, version: int, commit_id: str, where: str) -> dict[str, list[int]]:
    """``inherited``: earlier commits and the shards of this version under their prefixes.

    Untrusted: each commit id is 32 hex digits other than this version's (keys stay inside
    the dataset), and each shard belongs to one commit only; that they are shards of this
    version is checked once the shard ids are known (``check_inherited_shards``).
    """
    if value is None:
        return {}
    require(version >= 2, where, "inherited shards need format_version 2")
    require(isinstance(value, dict) and len(value) <= MAX_SHARDS, where, "bad inherited")
    seen: set[int] = set()
    out: dict[str, list[int]] = {}
    for commit, shards in value.items():
        require(
            isinstance(commit, str) and bool(COMMIT_ID.match(commit)) and commit != commit_id,
            where,
            f"inherited commit {commit!r:.80} is not the 32 hex digits of an earlier commit",
        )
        listed = int_list(shards, f"{where} inherited shards of {commit}")
        require(
            not seen & set(listed) and len(set(listed)) == len(listed),
            where,
            f"inherited shards of {commit} must be distinct shards of this version",
        )
        seen.update(listed)
        out[commit] = listed
    return out


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
        require(
            layout.dtype == dtype and layout.row_shape == (),
            where,
            f"array {name!r} is stored as {layout.dtype} rows of shape {layout.row_shape}, "
            f"but a {kind!r} dataset has {dtype} elements there",
        )
