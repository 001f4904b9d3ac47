"""Numpy dtypes to and from JSON, and their Zarr v3 data type names.

Stored dtypes come back from metadata that may be damaged or hostile, so parsing accepts
only fixed-width numeric, bool and structured-of-those dtypes of bounded size: never
``object``, which would let stored metadata make numpy build Python objects.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.errors import MetadataError

_MAX_ITEMSIZE = 1 << 24
_ZARR_NAMES = {
    "b": {1: "bool"},
    "i": {1: "int8", 2: "int16", 4: "int32", 8: "int64"},
    "u": {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"},
    "f": {2: "float16", 4: "float32", 8: "float64"},
    "c": {8: "complex64", 16: "complex128"},
}


def check_plain_dtype(dtype: np.dtype[Any], what: str) -> None:
    """Raise ``ValueError`` unless ``dtype`` is fixed-width numeric/bool (maybe structured)."""
    if dtype.hasobject:
        raise ValueError(f"{what}: dtype {dtype} holds Python objects; only numeric fields")
    if dtype.fields is not None:
        for name, (field_dtype, *_rest) in dtype.fields.items():
            check_plain_dtype(field_dtype, f"{what} field {name!r}")
        return
    if dtype.subdtype is not None:
        check_plain_dtype(dtype.subdtype[0], what)
        return
    if dtype.kind not in "biufc":
        raise ValueError(f"{what}: dtype {dtype} is not a fixed-width numeric or bool type")


def little_endian(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in the stored byte order: every field little-endian (one byte: unchanged).

    Writers convert rows to it, as numpy converts byte order: values stay equal.
    """
    return dtype.newbyteorder("<") if dtype.byteorder != "|" or dtype.fields else dtype


def dtype_to_json(dtype: np.dtype[Any]) -> Any:
    """A JSON value that ``dtype_from_json`` turns back into an equal dtype."""
    descr = np.lib.format.dtype_to_descr(dtype)
    return _tuples_to_lists(descr)


def _tuples_to_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_tuples_to_lists(item) for item in value]
    return value


def _lists_to_tuples(value: Any, depth: int = 0) -> Any:
    if depth > 8:
        raise MetadataError("stored dtype is nested too deeply")
    if isinstance(value, list):
        if value and all(isinstance(item, list) for item in value):
            return [_lists_to_tuples(item, depth + 1) for item in value]
        return tuple(_lists_to_tuples(item, depth + 1) for item in value)
    return value


def dtype_from_json(value: Any, what: str = "stored dtype") -> np.dtype[Any]:
    """Parse a stored dtype, refusing anything that is not plain fixed-width data."""
    if not isinstance(value, (str, list)):
        raise MetadataError(f"{what} must be a string or a list, found {type(value).__name__}")
    if len(repr(value)) > 65536:
        raise MetadataError(f"{what} description is unreasonably long")
    try:
        descr = value if isinstance(value, str) else _lists_to_tuples(value)
        dtype = np.lib.format.descr_to_dtype(descr)
    except MetadataError:
        raise
    except Exception as error:
        raise MetadataError(f"{what} {value!r} is not a valid numpy dtype: {error}") from error
    try:
        check_plain_dtype(dtype, what)
    except ValueError as error:
        raise MetadataError(str(error)) from error
    if dtype.itemsize == 0 or dtype.itemsize > _MAX_ITEMSIZE:
        raise MetadataError(f"{what} has item size {dtype.itemsize}, outside 1..{_MAX_ITEMSIZE}")
    return dtype


def zarr_data_type(dtype: np.dtype[Any]) -> tuple[str, str | None]:
    """The Zarr v3 ``data_type`` and ``bytes`` codec endianness for a scalar dtype."""
    names = _ZARR_NAMES.get(dtype.kind, {})
    name = names.get(dtype.itemsize)
    if name is None or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"dtype {dtype} has no Zarr v3 core data type")
    if dtype.itemsize == 1:
        return name, None
    return name, "big" if dtype.byteorder == ">" else "little"
