"""The dataset manifest: the group attributes that make a dataset exist.

``<dataset>/zarr.json`` is a Zarr v3 group whose ``attributes.rangestream`` names the kind
of storage, the format schema, the layout of each array and, per shard, the length of each
array. It is O(shards) bytes and one request, whatever the record count, so opening a
dataset is as fast with billions of records as with thousands. It is written last, by the
commit; before that the dataset does not exist for readers.

Everything here is parsed as untrusted input: bounded sizes, exact types, no pickle, and
keys that cannot leave the dataset prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rangestream.errors import MetadataError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import dtype_from_json
from rangestream.layout.zarr_json import group_document

FORMAT_VERSION = 1
#: The version written when a manifest references shards of earlier commits
#: (``inherited``): readers of version 1 refuse it instead of looking for those shards
#: under the new commit. Manifests without inherited shards stay version 1.
INHERITING_FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (FORMAT_VERSION, INHERITING_FORMAT_VERSION)
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


@dataclass(frozen=True)
class Manifest:
    """What a committed dataset is: kind, schema, array layouts and per-shard lengths.

    ``inherited`` maps an earlier commit id to the shards of this version whose data was
    written under that commit's prefix (an append adds shards without copying the old
    ones); every other shard lies under this version's own prefix.
    """

    kind: str
    commit_id: str
    schema: dict[str, Any]
    arrays: dict[str, ArrayLayout]
    shard_ids: np.ndarray
    lengths: dict[str, np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)
    inherited: dict[str, list[int]] = field(default_factory=dict)
    _shard_commits: dict[int, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owners = {
            int(shard): commit for commit, shards in self.inherited.items() for shard in shards
        }
        object.__setattr__(self, "_shard_commits", owners)

    def shard_commit(self, shard: int) -> str:
        """The commit under whose prefix ``shard``'s data lies."""
        return self._shard_commits.get(shard, self.commit_id)

    @property
    def commits(self) -> list[str]:
        """Every commit whose prefix this version reads: its own, then the inherited."""
        return [self.commit_id, *self.inherited]

    def array_key(self, shard: int, name: str) -> str:
        return array_key(self.shard_commit(shard), shard, name)

    def to_attributes(self) -> dict[str, Any]:
        attributes = {
            "format_version": INHERITING_FORMAT_VERSION if self.inherited else FORMAT_VERSION,
            "kind": self.kind,
            "commit_id": self.commit_id,
            "data_prefix": data_prefix(self.commit_id),
            "schema": self.schema,
            "arrays": {name: layout.to_json() for name, layout in self.arrays.items()},
            "shards": {
                "ids": [int(s) for s in self.shard_ids],
                "lengths": {
                    name: [int(n) for n in values] for name, values in self.lengths.items()
                },
            },
            "extra": self.extra,
        }
        if self.inherited:
            attributes["inherited"] = {c: sorted(shards) for c, shards in self.inherited.items()}
        return attributes

    def root_document(self) -> dict[str, Any]:
        return group_document({"rangestream": self.to_attributes()})


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
    _require(
        type(version) is int and version in READABLE_FORMAT_VERSIONS,
        where,
        f"format_version {version!r} is not supported (this library reads "
        f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))})",
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
        arrays[name] = ArrayLayout.from_json(layout_json, f"{where} array {name!r}")
    shards = value.get("shards")
    _require(isinstance(shards, dict), where, "shards must be an object")
    ids = _int_list(shards.get("ids"), f"{where} shard ids")
    _require(len(ids) <= MAX_SHARDS, where, "too many shards")
    shard_ids = np.asarray(ids, dtype=np.int64)
    _require(bool((shard_ids >= 0).all()), where, "shard ids must be non-negative")
    _require(bool((np.diff(shard_ids) > 0).all()), where, "shard ids must be strictly increasing")
    lengths_json = shards.get("lengths")
    _require(isinstance(lengths_json, dict), where, "shard lengths must be an object")
    _require(set(lengths_json) == set(arrays), where, "shard lengths must name every array")
    lengths = {}
    for name in arrays:
        values = np.asarray(_int_list(lengths_json[name], f"{where} {name} lengths"), np.int64)
        _require(len(values) == len(shard_ids), where, f"{name} lengths do not match shard ids")
        _require(bool((values >= 0).all()), where, f"{name} lengths must be non-negative")
        _require(bool((values < 1 << 50).all()), where, f"{name} lengths are out of range")
        _require(
            float(values.sum(dtype=np.float64)) < MAX_TOTAL_ROWS,
            where,
            f"{name} lengths add up to more than {MAX_TOTAL_ROWS} rows",
        )
        lengths[name] = values
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
    inherited = _inherited(value.get("inherited"), version, commit_id, shard_ids, where)
    return Manifest(kind, commit_id, schema, arrays, shard_ids, lengths, extra, inherited)


def _inherited(
    value: Any, version: int, commit_id: str, shard_ids: np.ndarray, where: str
) -> dict[str, list[int]]:
    """``inherited``: earlier commits and the shards of this version under their prefixes.

    Untrusted: each commit id is 32 hex digits other than this version's (keys stay inside
    the dataset), each shard is one of this version's and belongs to one commit only.
    """
    if value is None:
        return {}
    _require(version >= INHERITING_FORMAT_VERSION, where,
             f"inherited shards need format_version {INHERITING_FORMAT_VERSION}")  # fmt: skip
    _require(isinstance(value, dict) and len(value) <= MAX_SHARDS, where, "bad inherited")
    known = set(shard_ids.tolist())
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
            set(listed) <= known and not seen & set(listed) and len(set(listed)) == len(listed),
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
