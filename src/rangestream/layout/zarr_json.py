"""The ``zarr.json`` documents of arrays and groups, exactly as Zarr v3 specifies them.

We write these ourselves (a test opens every array with zarr-python to prove they are
valid) because the writer streams blocks before the array's final length is known; the
array document is written once, last, with the final shape.
"""

from __future__ import annotations

import json
from typing import Any

from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import zarr_data_type


def array_document(
    layout: ArrayLayout, length: int, attributes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The Zarr v3 array metadata of ``length`` rows stored with ``layout``."""
    dtype = layout.dtype
    attributes = dict(attributes or {})
    if dtype.fields is not None or dtype.subdtype is not None:
        # Zarr v3 has no core structured type: rows are stored as bytes, dtype in attributes
        from rangestream.layout.dtypes import dtype_to_json

        data_type, endian, trailing = "uint8", None, [*layout.row_shape, dtype.itemsize]
        attributes["rangestream_row_dtype"] = dtype_to_json(dtype)
    else:
        data_type, endian = zarr_data_type(dtype)
        trailing = list(layout.row_shape)
    # Zarr v3 lets single-byte types omit the byte order, but older readers (zarrita)
    # refuse a bytes codec without one: name it always. Stored data is little-endian.
    bytes_codec: dict[str, Any] = {"name": "bytes", "configuration": {"endian": endian or "little"}}
    fill_value: Any = False if data_type == "bool" else 0
    if data_type.startswith("float"):
        fill_value = 0.0
    elif data_type.startswith("complex"):
        fill_value = [0.0, 0.0]
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [length, *trailing],
        "data_type": data_type,
        "chunk_grid": {
            "name": "regular",
            "configuration": {"chunk_shape": [layout.block_rows, *trailing]},
        },
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [layout.chunk_rows, *trailing],
                    "codecs": [bytes_codec, {"name": "crc32c"}],
                    "index_codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "crc32c"},
                    ],
                    "index_location": "end",
                },
            }
        ],
        "attributes": attributes,
        "storage_transformers": [],
    }


def group_document(attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})}


def dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
