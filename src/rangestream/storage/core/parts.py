"""Part manifests: what each writer of a session leaves for the commit, and reading them.

A writer's part (``<session>/parts/<part id>.json``) lists the shards it wrote, with each
array's rows, and the schema its first record bound, if its kind binds one. It is written
columnar (``format_version`` 2)::

    {"part_id": "...", "format_version": 2, "shard_ids": [3, 4],
     "lengths": {"stream": [10, 7], "record_ends": [2, 1]}, "schema": {...}}

so a commit turns each part into arrays with one C-level JSON pass and one numpy
conversion per column: a commit of 10^5 shards in 1,000 parts must not run Python code per
shard. Parts of the first format (no ``format_version``; ``"shards": {"<id>": {array:
rows}}``) are still read: a session begun by an older writer may be committed by this one.

Parts are untrusted input: whatever one holds, the commit refuses it with a
``CommitError`` naming it, or reads exactly what its writer wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import CommitError
from rangestream.io.store import ObjectStore
from rangestream.layout.manifest import MAX_ROOT_BYTES

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind

#: The part format writers write; ``READ_PART_FORMATS`` are those commits read.
PART_FORMAT_VERSION = 2
READ_PART_FORMATS = (1, 2)
#: Bytes of a part read first: all of any part of up to ~50k shards, in one request (and,
#: on local disk, read inline rather than on a worker thread); a longer part costs a
#: second request for the rest, up to the metadata cap.
PART_FIRST_READ_BYTES = 1 << 20
#: Rows of one array in one shard, as readers bound them (``manifest_checks``).
MAX_SHARD_ROWS = 1 << 50
_MAX_INT64 = (1 << 63) - 1


@dataclass(frozen=True)
class Part:
    """One writer's part: its shards in the order it lists them, and its schema.

    ``lengths`` holds a column per array every listed shard has rows of (int64, by the
    position in ``shard_ids``).
    """

    key: str
    shard_ids: np.ndarray
    lengths: dict[str, np.ndarray]
    schema: dict[str, Any] | None


def part_document(
    part_id: str,
    shard_lengths: Mapping[int, Mapping[str, int]],
    schema: dict[str, Any] | None = None,
) -> bytes:
    """The part a writer leaves: ``shard_lengths`` (each shard's rows per array), columnar.

    Every shard of one writer has the same arrays (a kind's arrays are fixed once its first
    record binds the schema, before any shard exists).
    """
    shards = list(shard_lengths)
    names = list(shard_lengths[shards[0]]) if shards else []
    for shard in shards:
        if list(shard_lengths[shard]) != names:
            raise ValueError(
                f"shard {shard} has arrays {list(shard_lengths[shard])}, "
                f"the writer's other shards {names}"
            )
    document: dict[str, Any] = {
        "part_id": part_id,
        "format_version": PART_FORMAT_VERSION,
        "shard_ids": [int(shard) for shard in shards],
        "lengths": {name: [int(shard_lengths[s][name]) for s in shards] for name in names},
    }
    if schema is not None:
        document["schema"] = schema
    return json.dumps(document, separators=(",", ":")).encode()


async def read_part(store: ObjectStore, key: str) -> bytes:
    """A part's bytes, up to one byte past the metadata cap (``parse_part`` refuses more).

    One request of ``PART_FIRST_READ_BYTES``, and a second for the rest of a longer part.
    """
    head = await store.get_range(key, 0, PART_FIRST_READ_BYTES)
    if len(head) < PART_FIRST_READ_BYTES:
        return head
    return head + await store.get_range(key, PART_FIRST_READ_BYTES, MAX_ROOT_BYTES + 1)


def parse_part(raw: bytes, key: str, describe: Callable[[str], str] = str) -> Part:
    """The part in ``raw`` (read from ``key``), either format.

    Refused (``CommitError`` naming the part as ``describe(key)``): more than the metadata
    cap, not JSON, a format this library does not read, ids or lengths that are not
    integers in range, columns of another length than the ids.
    """
    try:
        if len(raw) > MAX_ROOT_BYTES:
            raise ValueError(f"larger than the {MAX_ROOT_BYTES}-byte metadata cap")
        document = json.loads(raw)
        if not isinstance(document, dict):
            raise TypeError("a part manifest must be a JSON object")
        schema = document.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError("schema must be an object")
        version = document.get("format_version", 1)
        if type(version) is not int:  # not true, not 2.0
            raise TypeError(f"format_version {version!r} must be an integer")
        if version == 1:
            ids, lengths = _first_format(document["shards"])
        elif version == 2:
            ids, lengths = _columnar(document["shard_ids"], document["lengths"])
        else:
            raise ValueError(
                f"format_version {version!r} is not one this library reads "
                f"({', '.join(map(str, READ_PART_FORMATS))}): written by a newer version?"
            )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise CommitError(f"part manifest {describe(key)} is unreadable: {error}") from error
    return Part(key, ids, lengths, schema)


def _columnar(shard_ids: Any, lengths: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Ids and lengths of a ``format_version`` 2 part."""
    ids = _integers(shard_ids, "shard_ids", _MAX_INT64 + 1)
    if not isinstance(lengths, dict):
        raise TypeError("lengths must be an object of one list per array")
    columns = {}
    for name, values in lengths.items():
        column = _integers(values, f"lengths[{name!r}]", MAX_SHARD_ROWS)
        if len(column) != len(ids):
            raise ValueError(f"lengths[{name!r}] lists {len(column)} shards, shard_ids {len(ids)}")
        columns[name] = column
    return ids, columns


def _first_format(shards: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Ids and lengths of a part of the first format: ``{"<id>": {array: rows}}``.

    A column is kept for each array every shard lists (as the commit used to read these
    parts, an array some shards lack cannot be committed, one no shard needs is ignored).
    """
    if not isinstance(shards, dict):
        raise TypeError("shards must be an object of shard id -> rows per array")
    ids = _integers([int(shard) for shard in shards], "shard ids", _MAX_INT64 + 1)
    entries = list(shards.values())
    for entry in entries:
        if not isinstance(entry, dict):
            raise TypeError(f"each shard's entry must be an object, not {entry!r:.40}")
    columns = {}
    for name in entries[0] if entries else ():
        try:
            values = [entry[name] for entry in entries]
        except KeyError:
            continue  # an array not every shard lists: refused only if the kind needs it
        columns[name] = _integers(values, f"{name} lengths", MAX_SHARD_ROWS)
    return ids, columns


def _integers(values: Any, what: str, end: int) -> np.ndarray:
    """``values`` (a JSON list) as int64, if every one is an integer in ``[0, end)``."""
    if not isinstance(values, list):
        raise TypeError(f"{what} must be a list of integers")
    if not values:
        return np.empty(0, dtype=np.int64)
    array = np.array(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"{what} must be a list of integers")
    if int(array.min()) < 0 or int(array.max()) >= end:  # Python ints: no overflow
        raise ValueError(f"{what} must lie in [0, {end})")
    return array.astype(np.int64, copy=False)


@dataclass(frozen=True)
class GatheredParts:
    """The parts of a session, checked to name each shard once, as one table.

    ``order`` sorts the concatenated shard ids of the parts (in their order); ``shard_ids``
    is them sorted.
    """

    parts: list[Part]
    shard_ids: np.ndarray
    order: np.ndarray
    describe: Callable[[str], str]

    def lengths(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Each array's rows by shard position (``shard_ids``); every part must list them."""
        out = {}
        for name in names:
            columns = []
            for part in self.parts:
                column = part.lengths.get(name)
                if column is None:
                    if not len(part.shard_ids):
                        column = np.empty(0, dtype=np.int64)
                    else:
                        raise CommitError(
                            f"part manifest {self.describe(part.key)} lists no rows of array "
                            f"{name!r} for some of its shards"
                        )
                columns.append(column)
            joined = np.concatenate(columns) if columns else np.empty(0, dtype=np.int64)
            out[name] = joined[self.order]
        return out


def gather_parts(
    storage: StorageKind, keys: Sequence[str], raws: Sequence[bytes], describe: Callable[[str], str]
) -> tuple[StorageKind, GatheredParts]:
    """The session's parts, read (``keys``, ``raws``), and the storage bound to their schema.

    Errors are those a part-by-part reading in key order meets first: an unreadable part,
    a schema that disagrees with an earlier part's, a shard an earlier part (or earlier in
    the same part) already listed. The schema is bound once per distinct schema (parts of
    one session almost always agree), the overlap found by one sort of all the ids.
    """
    parts: list[Part] = []
    bound: dict[str, Any] | None = None
    for key, raw in zip(keys, raws, strict=True):
        try:
            part = parse_part(raw, key, describe)
            if part.schema is not None and part.schema != bound:
                storage = storage.bind_schema(part.schema, describe(key))
                bound = part.schema
        except Exception:
            _sorted_ids(parts, describe)  # an overlap among the earlier parts came first
            raise
        parts.append(part)
    ids, order = _sorted_ids(parts, describe)
    return storage, GatheredParts(parts, ids, order, describe)


def _sorted_ids(parts: list[Part], describe: Callable[[str], str]) -> tuple[np.ndarray, np.ndarray]:
    """All shard ids of ``parts`` sorted, and the order sorting them; refuses an overlap."""
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.intp)
    ids = np.concatenate([part.shard_ids for part in parts])
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    repeated = ordered[1:] == ordered[:-1]
    if repeated.any():
        raise _overlap(parts, ids, order, repeated, describe)
    return ordered, order


def _overlap(
    parts: list[Part],
    ids: np.ndarray,
    order: np.ndarray,
    repeated: np.ndarray,
    describe: Callable[[str], str],
) -> CommitError:
    """The error for the first shard (in part order, then listing order) listed before.

    The stable sort keeps equal ids in listing order, so each repeat's first listing is
    the start of its run; the offender is the earliest listing that is a repeat.
    """
    positions = order[1:][repeated]
    offender = int(positions.min())
    shard = int(ids[offender])
    first = int(np.flatnonzero(ids == shard)[0])
    ends = np.cumsum([len(part.shard_ids) for part in parts])
    owner, part = (parts[int(np.searchsorted(ends, p, side="right"))] for p in (first, offender))
    if owner is part:
        return CommitError(
            f"part manifest {describe(part.key)} is unreadable: it lists shard {shard} twice"
        )
    return CommitError(
        f"shard {shard} was written by two writers ({owner.key} and {part.key}); "
        "each shard must have exactly one writer"
    )
