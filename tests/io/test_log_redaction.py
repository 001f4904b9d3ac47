"""A session token never reaches a log handler, on the s3fs path or the lean one."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import RangestreamError
from rangestream.io.log_redaction import REDACTED, hide_session_tokens

TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN0123456789abcdef"
TOKENS = np.dtype([("t", "<i4")])


def attempt_a_write(url: str, options: dict[str, Any]) -> None:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    try:  # the server does not know the token: refused, but every request was logged
        with storage.sync_writer() as writer:
            writer.append(0, {"t": np.arange(10, dtype="<i4")})
    except (RangestreamError, OSError):
        pass


@pytest.mark.parametrize("reads", ["s3fs", "lean"])
@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_session_token_is_never_logged_by_the_s3_client_libraries(
    s3_url: Location,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    reads: str,
    given: str,
) -> None:
    if reads == "s3fs":
        monkeypatch.setenv("RANGESTREAM_S3_READS", "s3fs")
    options = dict(s3_url.storage_options)
    if given == "option":
        options["token"] = TOKEN
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", options.pop("key"))
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options.pop("secret"))
        monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    attempt_a_write(s3_url.url, options)
    signed = [r for r in caplog.records if "x-amz-security-token" in r.getMessage().lower()]
    if reads == "s3fs":
        assert signed, "botocore logged no signed request: the check would be empty"
    assert TOKEN not in caplog.text
    assert all(TOKEN not in str(record.args) for record in caplog.records)
    assert all(REDACTED in record.getMessage() for record in signed)


def test_the_header_is_hidden_whatever_its_value_and_other_text_is_kept() -> None:
    hide_session_tokens()
    logger = logging.getLogger("botocore.auth")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        logger.debug("CanonicalRequest:\nGET\nhost:x\nx-amz-security-token:%s\n", "tok123")
        logger.debug("headers=%s", {"X-Amz-Security-Token": b"tok456", "Range": "bytes=0-9"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    first, second = (record.getMessage() for record in records)
    assert "tok123" not in first and f"x-amz-security-token:{REDACTED}" in first
    assert "tok456" not in second and "bytes=0-9" in second
