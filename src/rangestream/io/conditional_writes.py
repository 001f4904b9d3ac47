"""Whether an S3 server honours conditional writes, proved before a commit relies on them.

A commit publishes the root only over the version it read (``If-Match``, or
``If-None-Match: *`` for a new dataset). A server that accepts the headers and ignores
them (rclone ``serve s3`` does) turns a race of two commits into a silent loss: both
report success and one of them is gone. So before the first conditional write to an
endpoint, ``refusal`` writes a probe object under the dataset's prefix and checks that
writes which must fail do fail, and one that must succeed does; the verdict is kept per
endpoint and bucket for the life of the process.

Where the server does not honour them, ``S3Store.put_if_version`` refuses the commit with
``ConditionalWritesUnsupportedError`` naming what the server did, unless the user declares
that only one process at a time writes the dataset: ``RANGESTREAM_S3_SINGLE_WRITER=1`` in
the environment (read at each commit, inherited by worker processes). Commits then check,
then write, and read the root back: correct for one writer, not for several.

Other services (GCS ``ifGenerationMatch``, Azure ``If-Match`` ETags) prove theirs with
``proven``: the same four writes, through each service's own ``ConditionalPuts``; there the
declaration is ``RANGESTREAM_SINGLE_WRITER=1`` (which S3 accepts too).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from rangestream.errors import StorageError
from rangestream.io.process import ProcessLocal

__all__ = [
    "PROBE_PREFIX",
    "SINGLE_WRITER_ANY_ENV",
    "SINGLE_WRITER_ENV",
    "ConditionalPuts",
    "ConditionalWritesUnsupportedError",
    "is_condition_refusal",
    "proven",
    "refusal",
    "remember",
    "s3_error_of",
    "single_writer_declared",
    "unsupported",
    "unsupported_by",
]

SINGLE_WRITER_ENV = "RANGESTREAM_S3_SINGLE_WRITER"
#: The same declaration for every store (GCS, Azure and S3).
SINGLE_WRITER_ANY_ENV = "RANGESTREAM_SINGLE_WRITER"
#: Where probe objects are written, under the dataset's root (not under ``data/``: gc and
#: verify never see them); each is deleted right after the probe.
PROBE_PREFIX = "_rangestream-probes"
_WRONG_ETAG = '"00000000000000000000000000000000"'

#: Verdicts of this process: ``endpoint/bucket`` -> ``None`` (honoured) or what the server did.
_verdicts = ProcessLocal[dict[str, str | None]]()

PutObject = Callable[..., Awaitable[Any]]


class ConditionalWritesUnsupportedError(StorageError):
    """The S3 server does not honour ``If-Match`` / ``If-None-Match``: a commit there could be
    silently overwritten by a concurrent one, so it is refused (see ``SINGLE_WRITER_ENV``)."""


def single_writer_declared() -> bool:
    """Whether the user declared that one process at a time writes (``SINGLE_WRITER_ENV``)."""
    return any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
        for name in (SINGLE_WRITER_ENV, SINGLE_WRITER_ANY_ENV)
    )


def s3_error_of(error: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind an s3fs exception, if any."""
    current: BaseException | None = error
    for _ in range(8):
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return (response.get("Error") or {}).get("Code"), status
        if current is None:
            break
        current = current.__cause__ or current.__context__
    return None, None


def is_condition_refusal(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a write whose condition did not hold."""
    code, status = s3_error_of(error)
    return status in (409, 412) or code in {"PreconditionFailed", "ConditionalRequestConflict"}


def _not_implemented(error: BaseException) -> str | None:
    code, status = s3_error_of(error)
    if status == 501 or code == "NotImplemented":
        return f"answers HTTP {status} {code} to conditional writes"
    return None


def unsupported(endpoint: str, bucket: str, what: str) -> ConditionalWritesUnsupportedError:
    """The error a commit raises where conditional writes are not honoured."""
    return ConditionalWritesUnsupportedError(
        f"the S3 server at {endpoint} (bucket {bucket!r}) {what}: it does not honour "
        "conditional writes (If-Match / If-None-Match), so a concurrent commit could "
        "silently replace this one after it reported success. The commit is refused; its "
        "objects under data/ are left for `rangestream gc`. If only one process at a time "
        f"writes this dataset, declare it with {SINGLE_WRITER_ENV}=1 (commits then check, "
        "then write, and read back)."
    )


async def refusal(put: PutObject, delete: PutObject, endpoint: str, bucket: str,
                  prefix: str) -> str | None:  # fmt: skip
    """``None`` if the server honours conditional writes, else what it did instead.

    ``put`` and ``delete`` are s3fs's ``put_object`` / ``delete_object`` calls (keyword
    arguments as botocore takes them); the probe object goes under ``prefix``. Proved once
    per endpoint and bucket in this process; errors other than the server's answers to the
    conditions are raised (a later commit probes again).
    """
    verdicts = _verdicts.get_or_make(dict)
    label = f"{endpoint}/{bucket}"
    if label in verdicts:
        return verdicts[label]
    key = f"{prefix.rstrip('/')}/{PROBE_PREFIX}/conditional-writes-{uuid.uuid4().hex}".lstrip("/")
    verdict = await _probe(put, delete, bucket, key)
    verdicts[label] = verdict
    return verdict


def remember(endpoint: str, bucket: str, verdict: str) -> None:
    """Record what a real conditional write showed (a 501 after a successful probe)."""
    _verdicts.get_or_make(dict)[f"{endpoint}/{bucket}"] = verdict


async def _probe(put: PutObject, delete: PutObject, bucket: str, key: str) -> str | None:
    def probe(body: bytes, **condition: str) -> Awaitable[Any]:
        return put(Bucket=bucket, Key=key, Body=body, **condition)

    try:
        first = await probe(b"probe: created", IfNoneMatch="*")
    except OSError as error:
        if (answer := _not_implemented(error)) is not None:
            return answer
        if is_condition_refusal(error):
            return "refused a PUT with If-None-Match: * of an object that did not exist"
        raise
    try:
        for body, condition, what in (
            (b"probe: must fail", {"IfNoneMatch": "*"},
             "accepted a PUT with If-None-Match: * over an existing object"),
            (b"probe: must fail", {"IfMatch": _WRONG_ETAG},
             "accepted a PUT with If-Match: an ETag the object does not have"),
        ):  # fmt: skip
            try:
                await probe(body, **condition)
            except OSError as error:
                if not is_condition_refusal(error):
                    if (answer := _not_implemented(error)) is not None:
                        return answer
                    raise
            else:
                return what
        etag = str(first.get("ETag") or "")
        try:
            await probe(b"probe: replaced", IfMatch=etag)
        except OSError as error:
            if is_condition_refusal(error):
                return f"refused a PUT with If-Match: {etag}, the object's own ETag"
            if (answer := _not_implemented(error)) is not None:
                return answer
            raise
        return None
    finally:
        with contextlib.suppress(Exception):  # a leftover probe object is harmless
            await delete(Bucket=bucket, Key=key)


# -- other services: the same proof through each one's own conditional writes -----------


class ConditionalPuts(Protocol):
    """One service's conditional writes, as ``proven`` drives them on a probe object.

    ``create`` writes only if the object is absent, ``replace`` only if it is still
    ``version``; both return the new version and raise ``ConcurrentWriteError`` when the
    service refuses because the condition does not hold. ``wrong_version`` is a version
    no object can have (GCS generation 1, an all-zero Azure ETag).
    """

    wrong_version: str

    async def create(self, key: str, body: bytes) -> str: ...

    async def replace(self, key: str, body: bytes, version: str) -> str: ...

    async def remove(self, key: str) -> None: ...


async def proven(label: str, puts: ConditionalPuts, prefix: str, names: str) -> str | None:
    """``None`` if the service honours its conditional writes, else what it did instead.

    ``label`` names the endpoint and bucket (the verdict is kept per label and process);
    ``names`` says what the conditions are called there (in the verdict). The probe: a
    create must succeed, a second create and a replace of a wrong version must be
    refused, a replace of the right version must succeed. Other errors are raised (a
    later commit probes again).
    """
    from rangestream.errors import ConcurrentWriteError

    verdicts = _verdicts.get_or_make(dict)
    if label in verdicts:
        return verdicts[label]
    key = f"{prefix.rstrip('/')}/{PROBE_PREFIX}/conditional-writes-{uuid.uuid4().hex}".lstrip("/")
    verdict: str | None = None
    try:
        try:
            first = await puts.create(key, b"probe: created")
        except ConcurrentWriteError:
            verdict = f"refused a create-only write ({names}) of an object that did not exist"
        else:
            for attempt, what in (
                (lambda: puts.create(key, b"probe: must fail"),
                 f"accepted a create-only write ({names}) over an existing object"),
                (lambda: puts.replace(key, b"probe: must fail", puts.wrong_version),
                 f"accepted a write conditional on a version the object does not have "
                 f"({names})"),
            ):  # fmt: skip
                try:
                    await attempt()
                except ConcurrentWriteError:
                    continue
                verdict = what
                break
            else:
                try:
                    await puts.replace(key, b"probe: replaced", first)
                except ConcurrentWriteError:
                    verdict = f"refused a write conditional on the object's own version {first}"
    finally:
        with contextlib.suppress(Exception):  # a leftover probe object is harmless
            await puts.remove(key)
    verdicts[label] = verdict
    return verdict


def unsupported_by(service: str, where: str, what: str) -> ConditionalWritesUnsupportedError:
    """The error a commit raises on a service (GCS, Azure) that ignores its conditions."""
    return ConditionalWritesUnsupportedError(
        f"the {service} at {where} {what}: it does not honour conditional writes, so a "
        "concurrent commit could silently replace this one after it reported success. The "
        "commit is refused; its objects under data/ are left for `rangestream gc`. If only "
        f"one process at a time writes this dataset, declare it with {SINGLE_WRITER_ANY_ENV}=1 "
        "(commits then check, then write, and read back)."
    )
