"""Formats that describe themselves: their stored schema and the format it reopens as."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rangestream import RecordField, RecordFormat, StreamNumpyFormat
from rangestream.errors import MetadataError, SchemaMismatchError
from rangestream.formats import format_from_schema, format_schema, register_format
from rangestream.formats.described import check_given_format

TOKENS = np.dtype([("sequence", "<u2"), ("loss_mask", "u1")])


def test_a_stream_numpy_format_reopens_from_its_schema_and_the_stored_dtype() -> None:
    stored = json.loads(json.dumps(format_schema(StreamNumpyFormat(TOKENS))))
    assert stored == {"format": "stream_numpy", "version": 1}
    reopened = format_from_schema(stored, "ds", TOKENS)
    assert isinstance(reopened, StreamNumpyFormat)
    assert reopened.stream_dtype == TOKENS


def test_a_record_format_reopens_with_the_same_fields() -> None:
    fmt = RecordFormat([RecordField("chosen", np.dtype("<u2")), RecordField("reward", "<f4", 0)])
    stored = json.loads(json.dumps(format_schema(fmt)))
    assert format_from_schema(stored, "ds") == fmt


def test_a_format_without_a_schema_records_nothing() -> None:
    class Mine:
        stream_dtype = np.dtype("<i4")

    assert format_schema(Mine()) is None


@pytest.mark.parametrize(
    ("stored", "error", "match"),
    [
        ([1, 2], MetadataError, "must be an object"),
        ({"format": "../../etc"}, MetadataError, "bad name"),
        ({"format": "x" * 65}, MetadataError, "bad name"),
        ({"format": "nobody-registers-this"}, SchemaMismatchError, "no registered format"),
        ({"format": "stream_numpy", "version": 9}, MetadataError, "version 9"),
        ({"format": "records", "version": 1, "fields": "all"}, MetadataError, "fields"),
    ],
)
def test_a_malformed_or_unknown_stored_format_is_refused(
    stored: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        format_from_schema(stored, "ds", TOKENS)


def test_a_stream_numpy_schema_over_a_plain_dtype_is_refused() -> None:
    with pytest.raises(MetadataError, match="structured"):
        format_from_schema({"format": "stream_numpy", "version": 1}, "ds", np.dtype("<i4"))


def test_a_registered_factory_reopens_its_own_format() -> None:
    class Tagged:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def schema(self) -> dict[str, Any]:
            return {"format": "test-tagged", "tag": self.tag}

    def factory(value: dict[str, Any], dtype: Any, where: str) -> Tagged:
        return Tagged(str(value["tag"]))

    register_format("test-tagged", factory, replace=True)
    with pytest.raises(ValueError, match="already registered"):
        register_format("test-tagged", factory)
    stored = format_schema(Tagged("abc"))
    assert format_from_schema(stored, "ds").tag == "abc"


def test_a_schema_method_returning_no_named_object_is_refused_before_storing() -> None:
    class Bad:
        def schema(self) -> Any:
            return ["not", "an", "object"]

    with pytest.raises(TypeError, match="'format' name"):
        format_schema(Bad())


def test_a_given_format_that_describes_another_one_is_refused() -> None:
    fmt = RecordFormat([RecordField("chosen", np.dtype("<u2"))])
    other = RecordFormat([RecordField("chosen", np.dtype("<u4"))])
    check_given_format(fmt, fmt.schema(), "ds")  # the same: accepted
    check_given_format(fmt, None, "ds")  # the store records nothing: accepted
    with pytest.raises(SchemaMismatchError, match=r"ds was written with the format .*<u4"):
        check_given_format(fmt, other.schema(), "ds")
