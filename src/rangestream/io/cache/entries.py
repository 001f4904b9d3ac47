"""Entry files of the byte cache: which keys may be cached, where an entry lives, its format.

Why a module of its own: the names and the 8-byte header are the directory's on-disk
contract, read by the cache itself, by eviction scans and by ``rangestream cache``; keeping
them in one place keeps those readers in agreement.

An entry is an 8-byte header (``RSC1`` and the CRC-32C of the payload) and the payload.
Only keys under ``data/<commit>/`` are cached: a committed version is immutable
(format.md), so an entry can never be stale. Names under an object's folder::

    r<start>-<end>   a fetched range of the object
    s<n>             its last n bytes (a chunk index)
    o<max>           the whole (small) object
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import struct
import uuid
from pathlib import Path

import google_crc32c

from rangestream.io.ranges import ByteRequest, ObjectRequest, RangeRequest, SuffixRequest

__all__ = [
    "HEADER",
    "MAGIC",
    "RANGE_ENTRY",
    "dataset_id",
    "entry_header",
    "entry_name",
    "intact",
    "is_cacheable_key",
    "object_folder",
    "range_spans",
    "temp_path",
    "write_entry",
]

MAGIC = b"RSC1"
#: Bytes before an entry's payload: the magic and the payload's CRC-32C.
HEADER = 8

_IMMUTABLE = re.compile(r"^data/([0-9a-f]{32})/(.+)$")
#: The name of a range entry: ``r<start>-<end>``.
RANGE_ENTRY = re.compile(r"^r(\d+)-(\d+)$")


def is_cacheable_key(key: str) -> bool:
    """Whether ``key`` belongs to a committed version (immutable), so it may be cached."""
    return _IMMUTABLE.match(key) is not None


def dataset_id(url: str) -> str:
    """The directory name of a dataset's entries: a hash of its URL."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:20]


def object_folder(directory: Path, url: str, key: str) -> Path:
    """The folder of one object's entries: ``<dataset id>/<commit>/<key, / as ~>``."""
    match = _IMMUTABLE.match(key)
    assert match is not None, key
    return directory / dataset_id(url) / match.group(1) / match.group(2).replace("/", "~")


def entry_name(request: ByteRequest) -> str:
    """The file name of the entry holding the bytes of ``request``."""
    if isinstance(request, RangeRequest):
        return f"r{request.start}-{request.end}"
    if isinstance(request, SuffixRequest):
        return f"s{request.nbytes}"
    assert isinstance(request, ObjectRequest)
    return f"o{request.max_nbytes if request.max_nbytes is not None else 'all'}"


def entry_header(payload: bytes | memoryview) -> bytes:
    """The header written before ``payload``."""
    return MAGIC + struct.pack("<I", google_crc32c.value(bytes(payload)))


def write_entry(fd: int, payload: bytes | memoryview) -> None:
    """Write the entry of ``payload`` (header, then payload) to ``fd`` in one ``writev``
    (more only if the kernel writes less)."""
    views = [memoryview(part).cast("B") for part in (entry_header(payload), payload)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def intact(whole: bytes, payload: int) -> bool:
    """Whether ``whole`` (an entry read with one byte to spare) holds ``payload`` bytes
    whose CRC matches its header: a truncated, extended or flipped entry is not."""
    if len(whole) != HEADER + payload or whole[:4] != MAGIC:
        return False
    (stored,) = struct.unpack("<I", whole[4:HEADER])
    return int(google_crc32c.value(whole[HEADER:])) == stored


def range_spans(folder: Path) -> list[tuple[int, int]]:
    """The byte ranges an object's range entries hold (none if it has no folder yet)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    spans = []
    for name in names:
        match = RANGE_ENTRY.match(name)
        if match is not None:
            spans.append((int(match.group(1)), int(match.group(2))))
    return spans


def temp_path(directory: Path, nbytes: int) -> Path:
    """A new file name in ``tmp/``; its last field is the bytes it reserves (see ``budget``).

    Unique without a ``uuid4`` per entry (a ``getrandom`` call per cold fetch call): the
    pid, a random token drawn once per process (again in a forked child) and a counter.
    """
    return Path(f"{directory}/tmp/{os.getpid()}-{_token}{next(_serial):x}-{nbytes}")


def _new_token() -> None:
    global _token, _serial
    _token, _serial = uuid.uuid4().hex[:8], itertools.count()


_token = ""
_serial = itertools.count()
_new_token()
os.register_at_fork(after_in_child=_new_token)
