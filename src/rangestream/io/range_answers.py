"""Answers to S3 range requests, checked, never trusted: the bytes asked for, or an error.

Servers answer a range GET in three shapes, and both S3 read paths (the lean client and
s3fs) check every answer here:

- 206 with a ``Content-Range`` (AWS, SeaweedFS, MinIO, moto);
- 200 with a ``Content-Range`` and only the bytes asked for (rclone ``serve s3``);
- 200 without one: the server ignored the range and sends the whole object.

The first two are accepted only if the ``Content-Range`` names the range asked for and the
body has its length. The third is sliced only if its length is the object's (from a HEAD,
when the range does not start at 0: a 200 carrying just the asked bytes without saying so
would otherwise be sliced at the wrong offset). Anything else is a ``WrongRangeError``
naming the server's answer. Bytes from a wrong offset would pass every crc32c (each chunk
carries a valid checksum of its own bytes), so no answer is ever believed unchecked.
"""

from __future__ import annotations

import re

from rangestream.io.retry import ShortReadError, WrongRangeError

__all__ = [
    "needs_object_size",
    "parse_content_range",
    "ranged_body",
    "suffix_body",
]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def parse_content_range(
    value: str | None, where: str, status: int = 206
) -> tuple[int, int, int | None]:
    """``(first, last, total)`` of a ``Content-Range: bytes a-b/n`` header (``n`` may be ``*``)."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None or int(match.group(2)) < int(match.group(1)):
        raise WrongRangeError(
            f"{where}: the server answered HTTP {status} to a range request with an unusable "
            f"Content-Range ({value!r})"
        )
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def needs_object_size(status: int, content_range: str | None, start: int) -> bool:
    """Whether checking this answer needs the object's size: a 200 without ``Content-Range``
    to a range that does not start at 0 is sliced only if it is the whole object."""
    return status == 200 and not content_range and start > 0


def ranged_body(
    status: int,
    content_range: str | None,
    body: bytes,
    start: int,
    end: int,
    where: str,
    *,
    announced: int | None = None,
    object_size: int | None = None,
) -> bytes:
    """The bytes ``[start, end)`` of an answer to a range request, checked.

    ``body`` holds at most ``end`` bytes of a 200 (the caller stops reading there);
    ``announced`` is the answer's ``Content-Length``; ``object_size`` the object's size,
    which the caller looks up when ``needs_object_size`` says so. A 416 means the range
    starts past the object's end (``b""``).
    """
    if status == 416:
        return b""
    asked = f"asked for bytes {start}-{end - 1}"
    if status == 206 or (status == 200 and content_range):
        first, last, total = parse_content_range(content_range, where, status)
        if first != start or last >= end:
            raise WrongRangeError(
                f"{where}: {asked}, the server answered HTTP {status} with {content_range!r}: "
                "another range than asked (refused: its bytes would pass for the ones asked)"
            )
        if len(body) != last - first + 1:
            raise ShortReadError(
                f"{where}: {asked}, got HTTP {status} {content_range!r} with {len(body)} bytes"
            )
        if last != end - 1 and (total is None or last != total - 1):
            raise ShortReadError(
                f"{where}: {asked}, got HTTP {status} {content_range!r}: the answer ends "
                "early although the object does not"
            )
        return body
    if status != 200:
        raise WrongRangeError(
            f"{where}: {asked}, the server answered HTTP {status} (neither 206, nor 200 with "
            "the range or the whole object)"
        )
    if start == 0:  # the whole object's first bytes are the range's, whatever was sent
        return body[:end]
    if object_size is None:
        raise AssertionError("a 200 without Content-Range needs the object's size")
    whole = (
        announced == object_size
        if announced is not None
        else (len(body) == object_size if len(body) < end else object_size >= end)
    )
    if not whole:
        length = f"{announced} bytes" if announced is not None else f"{len(body)}+ bytes"
        raise WrongRangeError(
            f"{where}: {asked}, the server answered HTTP 200 with {length} and no "
            f"Content-Range, but the object has {object_size} bytes: neither the range nor "
            "the whole object (refused: its offset is unknown)"
        )
    return body[start:end]


def suffix_body(
    status: int, content_range: str | None, body: bytes, nbytes: int, where: str
) -> bytes:
    """The last ``nbytes`` bytes of an object (all of them if it is shorter), checked.

    ``body`` is the complete answer (its ``Content-Length`` already checked).
    """
    if status == 416:  # an empty object has no last byte to count from
        return b""
    asked = f"asked for the last {nbytes} bytes"
    if status == 206 or (status == 200 and content_range):
        first, last, total = parse_content_range(content_range, where, status)
        if len(body) != last - first + 1 or (total is not None and last != total - 1):
            raise ShortReadError(
                f"{where}: {asked}, got HTTP {status} {content_range!r} with {len(body)} bytes"
            )
        if total is not None and len(body) != min(nbytes, total):
            raise WrongRangeError(
                f"{where}: {asked}, the server answered HTTP {status} with {content_range!r}: "
                "another range than asked"
            )
        return body
    if status != 200:
        raise WrongRangeError(
            f"{where}: {asked}, the server answered HTTP {status} (neither 206, nor 200 with "
            "the range or the whole object)"
        )
    return body[-nbytes:]  # the whole object
