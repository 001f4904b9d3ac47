"""What a store says about an object besides its bytes: size, age and version.

Listings with sizes and modification times let ``gc`` and ``verify`` weigh and date
prefixes without reading objects. A *version token* names one state of one object, so a
commit can replace the root only if it is still the state the commit read (S3's ETag with
``If-Match``; elsewhere a digest of the content, which is unique per commit because every
root names its commit id).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["ObjectInfo", "content_version"]


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing: its key under the dataset root, bytes and last write."""

    key: str
    size: int
    #: Seconds since the epoch of the last write, ``None`` where the store does not say.
    modified: float | None


def content_version(data: bytes | memoryview, size: int | None = None) -> str:
    """A version token made from an object's bytes (and its full size, if only a prefix
    of it was read)."""
    digest = hashlib.sha256(data).hexdigest()
    return digest if size is None or size == len(data) else f"{size}:{digest}"
