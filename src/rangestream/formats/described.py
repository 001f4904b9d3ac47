"""Formats that describe themselves: their stored schema, and the format it reopens as.

A format with a ``schema()`` method returns a small JSON object naming it
(``{"format": "records", "version": 1, ...}``); the storage kinds store it in the dataset's
schema under ``"format"``, so ``StreamStorage(url)`` or ``DocumentStorage(url)`` can read
the dataset without being handed the format object again. A stored schema is turned back
into a format by the factory registered under its name, as zarr-python finds codecs by
the name in array metadata: ``stream_numpy`` and ``records`` are built in, and a package
registers its own with ``register_format``.

The stored schema is untrusted input: its name is bounded and looked up, never imported
or unpickled, and each factory parses the rest as untrusted input too. A format without
``schema()`` records nothing, and must then be passed again to read the dataset.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from rangestream.errors import MetadataError, SchemaMismatchError

__all__ = ["FormatFactory", "format_from_schema", "format_schema", "register_format"]

#: ``factory(schema, stream_dtype, where)``: the format a stored schema describes.
#: ``stream_dtype`` is the stored element dtype of a stream kind (``None`` for documents);
#: ``where`` names the dataset in error messages.
FormatFactory = Callable[[dict[str, Any], "np.dtype[Any] | None", str], Any]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
#: Bound on one format's stored schema (serialized): a schema, not a payload.
MAX_SCHEMA_BYTES = 1 << 20
_FACTORIES: dict[str, FormatFactory] = {}


def register_format(name: str, factory: FormatFactory, *, replace: bool = False) -> None:
    """Reopen datasets whose stored format schema is named ``name`` with ``factory``.

    Parameters
    ----------
    name
        The ``"format"`` value of the schemas the format's ``schema()`` returns.
    factory
        ``factory(schema, stream_dtype, where) -> format``; it must treat ``schema`` as
        untrusted input and raise ``MetadataError`` for anything malformed.
    replace
        Allow replacing an earlier registration (otherwise an error, to catch clashes).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a format name is 1-64 letters, digits or '_.:-', got {name!r}")
    if name in _FACTORIES and not replace:
        raise ValueError(f"a format named {name!r} is already registered")
    _FACTORIES[name] = factory


def format_schema(storage_format: Any) -> dict[str, Any] | None:
    """What the dataset records about ``storage_format``: its ``schema()``, or ``None``.

    Raises ``TypeError`` if ``schema()`` returns something that is not a named, bounded
    JSON object: it would be stored, and could not be read back.
    """
    method = getattr(storage_format, "schema", None)
    if not callable(method):
        return None
    schema = method()
    who = type(storage_format).__name__
    if not isinstance(schema, dict) or not isinstance(schema.get("format"), str):
        raise TypeError(
            f"{who}.schema() must return a dict with a 'format' name, got {schema!r:.200}"
        )
    if not _NAME.match(schema["format"]):
        raise TypeError(f"{who}.schema() names the format {schema['format']!r}, not a valid name")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{who}.schema() is not JSON: {error}") from error
    if size > MAX_SCHEMA_BYTES:
        raise TypeError(f"{who}.schema() is {size} bytes, more than {MAX_SCHEMA_BYTES}")
    return schema


def format_from_schema(value: Any, where: str, stream_dtype: np.dtype[Any] | None = None) -> Any:
    """The format that a stored schema describes (untrusted input).

    Raises
    ------
    MetadataError
        If the stored schema is malformed.
    SchemaMismatchError
        If no registered format has its name (the package that registers it is not
        imported, or the dataset was written by a newer version).
    """
    if not isinstance(value, dict):
        raise MetadataError(f"{where}: the stored format must be an object, got {value!r:.200}")
    name = value.get("format")
    if not isinstance(name, str) or not _NAME.match(name):
        raise MetadataError(f"{where}: the stored format has a bad name {name!r:.80}")
    factory = _FACTORIES.get(name)
    if factory is None:
        raise SchemaMismatchError(
            f"{where} was written with the format {name!r}, which no registered format "
            f"reads (known: {sorted(_FACTORIES)}); import the package that registers it, "
            "or pass the format object"
        )
    return factory(value, stream_dtype, where)


def _stream_numpy(value: dict[str, Any], stream_dtype: np.dtype[Any] | None, where: str) -> Any:
    from rangestream.formats.stream_numpy import StreamNumpyFormat

    return StreamNumpyFormat.from_schema(value, stream_dtype, where)


def _records(value: dict[str, Any], stream_dtype: np.dtype[Any] | None, where: str) -> Any:
    from rangestream.formats.records import RecordFormat

    return RecordFormat.from_schema(value, f"{where} record schema")


register_format("stream_numpy", _stream_numpy)
register_format("records", _records)


def check_given_format(storage_format: Any, stored: Any, where: str) -> None:
    """Refuse a format passed to read a dataset that records another one.

    A format that does not describe itself (no ``schema()``) is the caller's word, checked
    only by the kind (its dtype); a dataset that records nothing accepts any format.
    """
    given = format_schema(storage_format)
    if stored is None or given is None or given == stored:
        return
    raise SchemaMismatchError(
        f"{where} was written with the format {_shown(stored)}, but "
        f"{type(storage_format).__name__} describes itself as {_shown(given)}"
    )


def _shown(schema: Any) -> str:
    text = json.dumps(schema, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:300] + "..."
