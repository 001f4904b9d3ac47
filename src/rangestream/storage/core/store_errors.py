"""The library's exception classes for what the store raises on the write path.

Reads already end in library errors (the range reader converts them); writes, commits,
gc and summaries go through ``library_errors`` so a caller never sees a bare builtin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rangestream.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    RangestreamError,
    StorageError,
)


def is_missing_bucket(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is S3's ``NoSuchBucket``: s3fs turns it into
    a ``FileNotFoundError`` that says only "The specified bucket does not exist"."""
    seen: BaseException | None = error
    for _ in range(8):  # a short chain: the client's error under one or two of ours
        if seen is None:
            return False
        code = getattr(seen, "response", {}) or {}
        if "NoSuchBucket" in (type(seen).__name__, str(code.get("Error", {}).get("Code", ""))):
            return True
        if "NoSuchBucket" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def bucket_of(url: str) -> str:
    """The bucket (or container) of an object store URL: ``s3://bucket/prefix``."""
    return url.split("://", 1)[-1].split("/", 1)[0]


@contextlib.contextmanager
def library_errors(what: str, url: str | None = None) -> Iterator[None]:
    """Raise the library's own class for an ``OSError`` of the store (``what`` failed).

    ``url``, the dataset's, turns S3's missing bucket into a ``BucketNotFoundError`` that
    names it and the bucket (the client says only that "the specified bucket" is missing).

    Reads already end in library errors (the range reader converts them); on the write
    path a local ``PermissionError`` or ``NotADirectoryError``, or S3's 403 (``retrying``
    passes permanent errors through untouched), reached the caller as a bare builtin.
    ``AccessDeniedError`` is also a ``PermissionError``, and every ``StorageError`` an
    ``OSError``, so code written against the builtins still catches them.
    """
    try:
        yield
    except RangestreamError:
        raise
    except PermissionError as error:
        raise AccessDeniedError(f"{what} was refused: {error}") from error
    except OSError as error:
        if url is not None and "://" in url and is_missing_bucket(error):
            raise BucketNotFoundError(
                f"{what} failed: bucket {bucket_of(url)!r} of {url} does not exist; "
                "create it first (writes create no bucket)"
            ) from error
        raise StorageError(f"{what} failed: {error}") from error


def keep_failure(failure: BaseException, cleanup: BaseException, leftovers: str) -> None:
    """Make ``failure`` carry the error of its clean-up, which failed too.

    The write's own failure is what its caller must see; the clean-up's becomes its
    context (unless that already holds another error) and a note says where the
    leftovers are.
    """
    if cleanup.__context__ is failure:
        cleanup.__context__ = None  # no cycle between the two
    if failure.__context__ is None or failure.__context__ is failure.__cause__:
        failure.__context__ = cleanup  # the cause, if any, still tells where it came from
    failure.add_note(
        f"cleaning up after this failure failed too ({type(cleanup).__name__}: {cleanup}); "
        f"the objects under {leftovers} are left for `rangestream gc`"
    )
