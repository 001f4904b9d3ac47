"""The store for a dataset URL: a local directory, S3, or any other fsspec filesystem.

Kept apart from the contract (``rangestream.io.store``), as zarr-python keeps
``storage/_common.py::make_store`` apart from ``abc/store.py``: the implementations import
the contract, and only this module imports the implementations.
"""

from __future__ import annotations

import os
import re
from typing import Any

from rangestream.errors import StorageError
from rangestream.io.store import ObjectStore

__all__ = ["is_local_url", "open_store"]

_LOCAL_PROTOCOLS = {"file", "local"}
_S3_PROTOCOLS = {"s3", "s3a"}
_GCS_PROTOCOLS = {"gs", "gcs"}
_AZURE_PROTOCOLS = {"az", "abfs", "abfss"}
#: ``scheme:`` followed by something other than ``//``: a mistyped URL (``s3:/bucket/x``)
#: that would otherwise be taken for a local directory named ``s3:``.
_SCHEME_WITHOUT_SLASHES = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(?!//)")


def is_local_url(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names a local directory, which :func:`open_store` serves with pread."""
    if isinstance(url, os.PathLike) or "://" not in str(url):
        return True
    return str(url).split("://", 1)[0] in _LOCAL_PROTOCOLS


def check_url(url: str) -> None:
    """Refuse URLs whose scheme is known but whose form is wrong (``s3:/bucket/x``)."""
    match = _SCHEME_WITHOUT_SLASHES.match(url)
    if match is None or (len(match.group(1)) == 1 and os.name == "nt"):  # a drive letter
        return
    scheme = match.group(1).lower()
    from fsspec.registry import known_implementations

    if scheme in _LOCAL_PROTOCOLS or scheme in known_implementations:
        raise StorageError(
            f"dataset URL {url!r} names the {scheme!r} scheme but lacks its '//': "
            f"write {scheme}://{url[len(scheme) + 1 :].lstrip('/')}"
        )


def open_store(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> ObjectStore:
    """The store for a dataset URL: a local path, ``file://``, ``s3://``, ``gs://``,
    ``az://`` / ``abfs://`` or any fsspec URL."""
    from rangestream.io.local import LocalStore

    if isinstance(url, os.PathLike):
        return LocalStore(os.fspath(url))
    if not isinstance(url, str) or not url:
        raise StorageError(f"a dataset URL must be a non-empty string or path, got {url!r}")
    check_url(url)
    if "://" not in url:
        return LocalStore(url)
    protocol, rest = url.split("://", 1)
    if protocol in _LOCAL_PROTOCOLS:
        return LocalStore(rest)
    if not rest.strip("/"):
        raise StorageError(f"dataset URL {url!r} names no bucket or path after {protocol}://")
    try:
        if protocol in _S3_PROTOCOLS:
            from rangestream.io.s3 import S3Store

            return S3Store(url, storage_options)
        if protocol in _GCS_PROTOCOLS:
            from rangestream.io.gcs import GcsStore

            return GcsStore(url, storage_options)
        if protocol in _AZURE_PROTOCOLS:
            from rangestream.io.azure import AzureStore

            return AzureStore(url, storage_options)
        from rangestream.io.fsspec_store import FsspecStore

        return FsspecStore(url, storage_options)
    except (ValueError, ImportError) as error:
        raise StorageError(f"no storage backend for URL {url!r}: {error}") from error
