"""What a ``fields`` argument selects: the groups a window reads and the fields cut out.

Its own module because both read paths use it: the window program (``read``) and the
mapped windows (``mapped_windows``), which neither imports the other for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream.errors import UnknownFieldError
from rangestream.storage.temporal.schema import TemporalSchema

__all__ = ["FieldOutput", "Selection", "as_written", "select"]


@dataclass(frozen=True, slots=True)
class FieldOutput:
    """One requested field: where it sits in its group's rows and how it is returned."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Selection:
    """The groups a ``fields`` argument needs, with the fields to cut out of each."""

    outputs: tuple[FieldOutput, ...]  # in the order the caller asked for
    groups: tuple[tuple[int, tuple[FieldOutput, ...]], ...]  # (group number, its fields)
    torch: tuple[str, ...] = ()  # fields written as torch tensors, returned as tensors


def as_written(result: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, Any]:
    """``result`` with the fields ``names`` as torch tensors sharing the arrays' memory
    (writable, owning it through the array). Without torch installed they stay arrays."""
    try:
        from torch import from_numpy
    except ImportError:  # a reader without torch still reads the data
        return result
    for name in names:
        result[name] = from_numpy(result[name])
    return result


def select(schema: TemporalSchema, fields: Sequence[str] | None) -> Selection:
    """The selection of ``fields`` (all fields for ``None``), refusing unknown or repeated
    names and a bare string (a field name where a list of them is expected)."""
    if isinstance(fields, (str, bytes)):
        raise TypeError(f"fields must be a list of field names, got the string {fields!r}")
    names = schema.field_names if fields is None else list(fields)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"fields {repeated} are asked for more than once in {list(names)}")
    unknown = [name for name in names if name not in schema.by_name]
    if unknown:
        raise UnknownFieldError(
            f"unknown field(s) {unknown}; the dataset's fields are {schema.field_names}"
        )
    outputs = []
    by_group: dict[int, list[FieldOutput]] = {}
    for name in names:
        number, position = schema.location[name]
        group = schema.groups[number]
        spec = group.fields[position]
        output = FieldOutput(name, spec.dtype, spec.shape, group.offsets[position],
                             spec.frame_nbytes)  # fmt: skip
        outputs.append(output)
        by_group.setdefault(number, []).append(output)
    return Selection(
        tuple(outputs),
        tuple((number, tuple(found)) for number, found in sorted(by_group.items())),
        tuple(name for name in names if schema.by_name[name].array_type == "torch"),
    )
