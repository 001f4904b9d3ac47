"""Temporal records: named fixed-width arrays sharing a frame axis, stored in field groups.

A record is a flat mapping of field name to an array shaped ``(frames, *trailing)``. Field
names, dtypes and trailing shapes are fixed for a dataset (its *schema*, taken from the first
record written); the number of frames varies per record. Fields are stored in *groups*:

- a group of one field is an array with the field's own dtype and shape, so any Zarr reader
  sees it as it was written;
- a group of several fields is interleaved per frame: one row holds every field of the group
  for that frame (a packed structured dtype), so a window of the group is one contiguous
  byte range, hence one request.

Everything here is pure: validation, the schema's JSON form, and encoding records into the
rows each group array gets. Stored schemas are parsed as untrusted input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream.errors import InvalidRecordError, MetadataError
from rangestream.formats.field_values import fit_to_field
from rangestream.layout.dtypes import dtype_from_json, dtype_to_json

__all__ = [
    "ARRAY_TYPES",
    "RECORD_ROWS",
    "FieldSpec",
    "GroupSpec",
    "TemporalSchema",
    "normalize_field_groups",
    "record_arrays",
]

#: 2: records start at the rows ``record_rows`` gives (writers pad so records do not
#: straddle blocks); 1 (no longer read) derived record starts from cumulative frame ends.
SCHEMA_VERSION = 2
#: Per-shard int64 array, one row ``(first_row, end_row)`` per record: where the record's
#: frames lie in every group array of the shard (rows between records are padding).
RECORD_ROWS = "record_rows"
#: A manifest holds at most 64 arrays; one is ``record_rows``.
MAX_GROUPS = 63
MAX_FIELDS = 4096
MAX_NAME_CHARS = 256
_ARRAY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_FIELD_KINDS = "biufc"


def _little(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in the stored byte order (little-endian; one-byte types are unchanged)."""
    return dtype.newbyteorder("<")


def _describe_dtype(dtype: np.dtype[Any]) -> str:
    return str(_little(dtype).newbyteorder("="))


#: How a field's windows are returned: as numpy arrays, or as torch tensors (the type the
#: first record written gave it; ``"numpy"`` is the default and is not written out).
ARRAY_TYPES = ("numpy", "torch")


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch."""
    module = type(value).__module__ or ""
    return module.split(".")[0] == "torch" and hasattr(value, "detach")


@dataclass(frozen=True)
class FieldSpec:
    """One field of the schema: its name, stored dtype, trailing (per-frame) shape, and
    whether it was written (so is returned) as a numpy array or a torch tensor."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    array_type: str = "numpy"

    @property
    def frame_nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)

    def describe(self) -> str:
        trailing = "".join(f", {extent}" for extent in self.shape)
        kind = "" if self.array_type == "numpy" else f" ({self.array_type})"
        return f"{_describe_dtype(self.dtype)} shaped (frames{trailing}){kind}"


@dataclass(frozen=True)
class GroupSpec:
    """Fields stored together in one array named ``array``, interleaved per frame."""

    array: str
    fields: tuple[FieldSpec, ...]

    @property
    def interleaved(self) -> bool:
        return len(self.fields) > 1

    @property
    def row_dtype(self) -> np.dtype[Any]:
        """The dtype of one stored row: the field's own, or a packed structured dtype."""
        if not self.interleaved:
            return self.fields[0].dtype
        return np.dtype([(f.name, f.dtype, f.shape) for f in self.fields])

    @property
    def row_shape(self) -> tuple[int, ...]:
        return () if self.interleaved else self.fields[0].shape

    @property
    def row_nbytes(self) -> int:
        return sum(f.frame_nbytes for f in self.fields)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Byte offset of each field within a row."""
        out, position = [], 0
        for spec in self.fields:
            out.append(position)
            position += spec.frame_nbytes
        return tuple(out)


def normalize_field_groups(field_groups: Any) -> tuple[tuple[str, ...], ...]:
    """Check ``field_groups`` (a list of lists of field names) and return it as tuples."""
    if field_groups is None:
        return ()
    if isinstance(field_groups, (str, bytes)):  # a value of the wrong shape, as LitData says
        raise ValueError(
            f"field_groups must be a list of lists of field names, got the string {field_groups!r}"
        )
    if not isinstance(field_groups, Iterable):
        raise TypeError(
            f"field_groups must be a list of lists of field names, got {field_groups!r}"
        )
    groups: list[tuple[str, ...]] = []
    seen: dict[str, int] = {}
    for number, group in enumerate(field_groups):
        if isinstance(group, (str, bytes)):  # ["clock"] where [["clock"]] was meant
            raise ValueError(
                f"field_groups[{number}] is the string {group!r}; each group is a list of "
                f"field names (e.g. [[{group!r}]])"
            )
        if not isinstance(group, Iterable):
            raise TypeError(f"field_groups[{number}] must be a list of field names, got {group!r}")
        names = tuple(group)
        if not names:
            raise ValueError(f"field_groups[{number}] is empty")
        for name in names:
            _check_field_name(name)
            if name in seen:
                raise ValueError(
                    f"field {name!r} is listed in field_groups[{seen[name]}] and "
                    f"field_groups[{number}]; a field belongs to one group"
                )
            seen[name] = number
        groups.append(names)
    return tuple(groups)


def _check_field_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise TypeError(
            f"field names must be non-empty strings of at most {MAX_NAME_CHARS} characters, "
            f"got {name!r}"
        )


def _as_array(name: str, value: Any) -> np.ndarray:
    """A field's value as a numpy array (torch tensors are converted), checked for kind."""
    if isinstance(value, (list, tuple)):
        # a later record's list is converted to the schema's dtype in TemporalSchema.check
        try:
            value = np.asarray(value)
        except ValueError as error:  # ragged nesting
            raise InvalidRecordError(f"field {name!r}: {error}") from error
    elif not isinstance(value, np.ndarray):
        if is_torch_tensor(value):
            try:
                value = value.detach().cpu().numpy()
            except (TypeError, RuntimeError) as error:
                raise InvalidRecordError(
                    f"field {name!r}: torch tensor of dtype {value.dtype} has no numpy "
                    f"equivalent ({error})"
                ) from error
        else:
            raise InvalidRecordError(
                f"field {name!r} must be a numpy array, a torch tensor or a list, got "
                f"{type(value).__name__}"
            )
    dtype = value.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in _FIELD_KINDS:
        raise InvalidRecordError(
            f"field {name!r} has dtype {dtype}: only fixed-width numeric or bool arrays are "
            "stored (no object, string, structured or datetime arrays)"
        )
    if value.ndim == 0:
        raise InvalidRecordError(f"field {name!r} is a scalar; fields are shaped (frames, ...)")
    if 0 in value.shape[1:]:
        raise InvalidRecordError(
            f"field {name!r} has shape {value.shape}: trailing dimensions must be non-zero"
        )
    return value


def record_arrays(record: Any) -> tuple[dict[str, np.ndarray], int]:
    """Validate a record on its own (no schema): its fields as arrays, and its frame count.

    Raises ``InvalidRecordError`` for a record that is not a non-empty mapping of names to
    numeric/bool arrays with one common, non-zero number of frames.
    """
    if not isinstance(record, Mapping):
        raise InvalidRecordError(
            f"a temporal record is a mapping of field name to array, got {type(record).__name__}"
        )
    if not record:
        raise InvalidRecordError("a temporal record needs at least one field")
    arrays: dict[str, np.ndarray] = {}
    for name, value in record.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise InvalidRecordError(f"field names must be non-empty strings, got {name!r}")
        arrays[name] = _as_array(name, value)
    frames = {name: int(array.shape[0]) for name, array in arrays.items()}
    counts = set(frames.values())
    if len(counts) > 1:
        listing = ", ".join(f"{name}: {count}" for name, count in frames.items())
        raise InvalidRecordError(
            f"the fields of a record must have the same number of frames, found {listing}"
        )
    (count,) = counts
    if count == 0:
        raise InvalidRecordError(
            f"the record has zero frames (fields {list(frames)}); records need at least one"
        )
    return arrays, count


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise MetadataError(f"{where}: {message}")


class TemporalSchema:
    """Fields (in record order) and the groups they are stored in.

    Build it from the first record with :meth:`from_record`; check and encode later records
    with :meth:`encode`; store it with :meth:`to_json` and read it back with
    :meth:`from_json`.
    """

    def __init__(self, fields: Sequence[FieldSpec], groups: Sequence[GroupSpec]) -> None:
        self.fields = tuple(fields)
        self.groups = tuple(groups)
        self.by_name = {spec.name: spec for spec in self.fields}
        #: field name -> (group number, position of the field in the group)
        self.location = {
            spec.name: (number, position)
            for number, group in enumerate(self.groups)
            for position, spec in enumerate(group.fields)
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TemporalSchema) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(self.to_json()))

    @property
    def field_names(self) -> list[str]:
        return [spec.name for spec in self.fields]

    @property
    def interleaved_groups(self) -> set[frozenset[str]]:
        """The groups of several fields, as sets (what ``field_groups`` decides)."""
        return {frozenset(f.name for f in g.fields) for g in self.groups if g.interleaved}

    # -- building ----------------------------------------------------------------------
    @classmethod
    def from_record(cls, record: Any, field_groups: Sequence[Sequence[str]] = ()) -> TemporalSchema:
        """The schema a record defines; fields not named in ``field_groups`` stand alone."""
        arrays, _frames = record_arrays(record)
        fields = [
            FieldSpec(
                name,
                _little(array.dtype),
                tuple(int(n) for n in array.shape[1:]),
                "torch" if is_torch_tensor(record[name]) else "numpy",
            )
            for name, array in arrays.items()
        ]
        by_name = {spec.name: spec for spec in fields}
        group_of: dict[str, tuple[str, ...]] = {}
        for group in field_groups:
            for name in group:
                if name not in by_name:
                    raise InvalidRecordError(
                        f"field_groups names field {name!r}, which the record does not have "
                        f"(its fields: {sorted(by_name)})"
                    )
                group_of[name] = tuple(group)
        members: list[tuple[str, ...]] = []
        emitted: set[tuple[str, ...]] = set()
        for spec in fields:
            group = group_of.get(spec.name, (spec.name,))
            if group not in emitted:
                emitted.add(group)
                members.append(group)
        if len(members) > MAX_GROUPS:
            raise InvalidRecordError(
                f"the record has {len(members)} field groups; at most {MAX_GROUPS} are stored "
                "(list fields together in field_groups)"
            )
        return cls(fields, _name_groups([[by_name[n] for n in group] for group in members]))

    # -- JSON --------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "fields": [
                {
                    "name": f.name,
                    "dtype": dtype_to_json(f.dtype),
                    "shape": list(f.shape),
                    **({} if f.array_type == "numpy" else {"type": f.array_type}),
                }
                for f in self.fields
            ],
            "groups": [
                {"array": g.array, "fields": [f.name for f in g.fields]} for g in self.groups
            ],
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> TemporalSchema:
        """Parse a stored schema, refusing anything malformed (it is untrusted input)."""
        _require(isinstance(value, dict), where, "temporal schema must be an object")
        version = value.get("version")
        _require(
            version == SCHEMA_VERSION,
            where,
            f"temporal schema version {version!r} is not supported (this library reads "
            f"version {SCHEMA_VERSION}; rewrite a dataset written by an older rangestream)",
        )
        fields_json = value.get("fields")
        _require(
            isinstance(fields_json, list) and len(fields_json) <= MAX_FIELDS,
            where,
            "fields must be a list",
        )
        fields: dict[str, FieldSpec] = {}
        for item in fields_json:
            _require(isinstance(item, dict), where, "each field must be an object")
            name = item.get("name")
            _require(
                isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS and name not in fields,
                where,
                f"bad or repeated field name {name!r}",
            )
            dtype = dtype_from_json(item.get("dtype"), f"{where} field {name!r}")
            _require(
                dtype.fields is None and dtype.subdtype is None and dtype.kind in _FIELD_KINDS,
                where,
                f"field {name!r} dtype {dtype} is not a plain numeric or bool type",
            )
            shape = item.get("shape")
            _require(
                isinstance(shape, list)
                and len(shape) <= 8
                and all(type(n) is int and 1 <= n <= 1 << 24 for n in shape),
                where,
                f"field {name!r} shape {shape!r} is invalid",
            )
            array_type = item.get("type", "numpy")
            _require(
                array_type in ARRAY_TYPES,
                where,
                f"field {name!r} type {array_type!r} is not one of {list(ARRAY_TYPES)}",
            )
            fields[name] = FieldSpec(name, _little(dtype), tuple(shape), array_type)
        groups_json = value.get("groups")
        _require(
            isinstance(groups_json, list) and len(groups_json) <= MAX_GROUPS,
            where,
            "groups must be a list",
        )
        groups: list[GroupSpec] = []
        placed: set[str] = set()
        arrays: set[str] = set()
        for item in groups_json:
            _require(isinstance(item, dict), where, "each group must be an object")
            array = item.get("array")
            _require(
                isinstance(array, str)
                and bool(_ARRAY_NAME.match(array))
                and array != RECORD_ROWS
                and array not in arrays,
                where,
                f"bad or repeated group array name {array!r}",
            )
            names = item.get("fields")
            _require(
                isinstance(names, list) and len(names) > 0, where, f"group {array!r} has no fields"
            )
            for name in names:
                _require(
                    isinstance(name, str) and name in fields and name not in placed,
                    where,
                    f"group {array!r} names unknown or already grouped field {name!r}",
                )
                placed.add(name)
            arrays.add(array)
            groups.append(GroupSpec(array, tuple(fields[name] for name in names)))
        _require(placed == set(fields), where, "every field must belong to exactly one group")
        return cls(list(fields.values()), groups)

    # -- records -------------------------------------------------------------------------
    def check(self, record: Any) -> tuple[dict[str, np.ndarray], int]:
        """Validate a record against this schema; its arrays and frame count."""
        if isinstance(record, Mapping) and set(record) != set(self.by_name):
            missing = [name for name in self.by_name if name not in record]
            extra = [name for name in record if name not in self.by_name]
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"unexpected {extra}")
            raise InvalidRecordError(
                f"record fields differ from the schema ({'; '.join(parts)}); "
                f"the schema's fields are {self.field_names}"
            )
        arrays, frames = record_arrays(record)
        for name, array in arrays.items():
            spec = self.by_name[name]
            if _little(array.dtype) != spec.dtype and isinstance(record[name], (list, tuple)):
                # values given as a list take the field's dtype if every one fits it
                array = fit_to_field(array, spec.dtype, name).astype(spec.dtype, copy=False)
                arrays[name] = array
            if _little(array.dtype) != spec.dtype:
                raise InvalidRecordError(
                    f"field {name!r}: expected dtype {_describe_dtype(spec.dtype)}, "
                    f"found {_describe_dtype(array.dtype)}"
                )
            if tuple(array.shape[1:]) != spec.shape:
                raise InvalidRecordError(
                    f"field {name!r}: expected trailing shape {spec.shape} (frames, *shape), "
                    f"found {tuple(array.shape[1:])} in shape {array.shape}"
                )
        return arrays, frames

    def encode(self, record: Any) -> tuple[dict[str, np.ndarray], int]:
        """Rows of every group array for ``record`` (validated first), and its frame count."""
        arrays, frames = self.check(record)
        rows: dict[str, np.ndarray] = {}
        for group in self.groups:
            if not group.interleaved:
                spec = group.fields[0]
                rows[group.array] = np.ascontiguousarray(arrays[spec.name], dtype=spec.dtype)
                continue
            packed = np.empty(frames, dtype=group.row_dtype)
            for spec in group.fields:
                packed[spec.name] = arrays[spec.name]
            rows[group.array] = packed
        return rows, frames

    def difference(self, other: TemporalSchema) -> str:
        """What differs between two schemas, in words (for error messages)."""
        if self.field_names != other.field_names:
            return f"fields {self.field_names} vs {other.field_names}"
        for mine, theirs in zip(self.fields, other.fields, strict=True):
            if mine != theirs:
                return f"field {mine.name!r}: {mine.describe()} vs {theirs.describe()}"
        mine_groups = [[f.name for f in g.fields] for g in self.groups]
        their_groups = [[f.name for f in g.fields] for g in other.groups]
        return f"field groups {mine_groups} vs {their_groups}"


def _name_groups(groups: list[list[FieldSpec]]) -> list[GroupSpec]:
    """Array names: a lone field's own name when it is a valid array name, else ``group_<k>``."""
    names: list[str | None] = []
    taken = {RECORD_ROWS}
    for group in groups:
        name = group[0].name if len(group) == 1 else None
        if name is not None and _ARRAY_NAME.match(name) and name not in taken:
            taken.add(name)
            names.append(name)
        else:
            names.append(None)
    out = []
    for number, (group, name) in enumerate(zip(groups, names, strict=True)):
        if name is None:
            name = f"group_{number}"
            while name in taken:
                name += "_"
            taken.add(name)
        out.append(GroupSpec(name, tuple(group)))
    return out
