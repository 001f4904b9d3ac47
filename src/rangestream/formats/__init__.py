"""Built-in formats: pure packing and unpacking, no I/O."""

from rangestream.formats.described import format_from_schema, format_schema, register_format
from rangestream.formats.document_pickle import DocumentPickleFormat
from rangestream.formats.records import RecordField, RecordFormat
from rangestream.formats.stream_numpy import StreamNumpyFormat

__all__ = [
    "DocumentPickleFormat",
    "RecordField",
    "RecordFormat",
    "StreamNumpyFormat",
    "format_from_schema",
    "format_schema",
    "register_format",
]
