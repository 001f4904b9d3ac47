"""The committed version of a dataset as a zarr-python group, for tools that speak Zarr.

Every array rangestream stores is plain Zarr v3 (``docs/format.md``), so zarr-python (or
tensorstore, or zarrs) can read it without this library; this hands such a tool the right
group, the committed version's ``data/<commit>``, which only the root document names.
Reads through zarr-python are slower than rangestream's own (it fetches block indexes and
inner chunks one by one) but give the whole Zarr API: slicing, ``.info``, array attributes.
zarr-python is an optional dependency (``pip install rangestream[zarr]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rangestream.io.local import LocalStore
from rangestream.layout.manifest import data_prefix

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind
    from rangestream.storage.core.opening import Opening

__all__ = ["open_zarr_group"]


def open_zarr_group(storage: StorageKind, opening: Opening) -> Any:
    """``storage``'s committed version (opened by ``opening``) as a read-only ``zarr.Group``."""
    try:
        import zarr
    except ImportError as error:  # an optional dependency
        raise ImportError(
            "reading a dataset with zarr-python needs it installed: pip install 'rangestream[zarr]'"
        ) from error
    opened = opening.get_sync()
    prefix = data_prefix(opened.manifest.commit_id)
    store = opened.store
    if isinstance(store, LocalStore):
        zarr_store: Any = zarr.storage.LocalStore(store.root, read_only=True)
    else:
        zarr_store = zarr.storage.FsspecStore.from_url(
            storage.url, storage_options=storage.storage_options or None, read_only=True
        )
    return zarr.open_group(store=zarr_store, path=prefix, mode="r")
