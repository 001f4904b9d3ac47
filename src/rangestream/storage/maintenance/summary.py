"""What a committed dataset holds, in a user's words: what ``rangestream inspect`` prints.

Everything comes from the root document (one bounded read) and two listings: the
committed version's objects (stored bytes) and the versions no reader can reach
(``gc``). Counts are of what a user appended (records, documents, elements), not of the
arrays that store them (``payload_offsets`` has one row more than documents per shard).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rangestream.errors import DatasetNotFoundError, MetadataError, MissingObjectError
from rangestream.io.local import LocalStore
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ObjectRequest
from rangestream.io.retry import RetryPolicy
from rangestream.io.stores import open_store
from rangestream.layout.dtypes import dtype_from_json
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    Manifest,
    data_prefix,
    shard_prefix,
)
from rangestream.layout.manifest_parsing import parse_root
from rangestream.storage.core.store_errors import library_errors
from rangestream.storage.maintenance.gc import find_orphans

__all__ = ["DatasetSummary", "summarize_dataset"]

#: What each kind's counts mean; ``runs`` and ``payload_offsets`` start with one row per
#: shard that stands for no appended item.
_KIND_WORDS = {
    "stream": "a stream of fixed-size elements (tokens and aligned fields)",
    "stream_with_meta": "a stream of elements with payloads attached to runs of them",
    "document": "documents, one encoded payload each",
    "temporal": "temporal records of named fields, read as frame windows",
}


@dataclass
class DatasetSummary:
    """A committed dataset described for people (``lines``) and scripts (``to_json``)."""

    url: str
    kind: str
    description: str
    commit_id: str
    committed_at: str | None
    previous_commit_id: str | None
    shards: int
    schema: dict[str, Any]
    counts: dict[str, int]
    stored_bytes: int
    stored_objects: int
    orphans: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [
            f"dataset   {self.url}",
            f"kind      {self.kind}: {self.description}",
        ]
        out.extend(f"{label:<9} {text}" for label, text in _schema_lines(self.schema))
        out.extend(f"{name:<9} {count:,}" for name, count in self.counts.items())
        out.append(f"shards    {self.shards}")
        out.append(f"stored    {self.stored_bytes:,} bytes in {self.stored_objects:,} objects")
        when = f", committed {self.committed_at}" if self.committed_at else ""
        out.append(f"version   {self.commit_id}{when}")
        if self.previous_commit_id:
            out.append(f"previous  {self.previous_commit_id} (kept for readers that opened it)")
        if self.orphans:
            size = sum(orphan["bytes"] for orphan in self.orphans)
            out.append(
                f"orphans   {len(self.orphans)} version(s) no reader uses, {size:,} bytes "
                f"(`rangestream gc {self.url}`)"
            )
        else:
            out.append("orphans   none")
        return out


def _schema_lines(schema: dict[str, Any]) -> list[tuple[str, str]]:
    lines = []
    if "fields" in schema:
        lines.append(("fields", ", ".join(schema["fields"])))
    if "groups" in schema:
        lines.append(("groups", "; ".join(schema["groups"])))
    if "payload_encoding" in schema:
        lines.append(("payloads", str(schema["payload_encoding"])))
    return lines


def summarize_dataset(
    url: str, storage_options: dict[str, Any] | None = None, *, retry: RetryPolicy | None = None
) -> DatasetSummary:
    """Describe the dataset committed at ``url`` (``DatasetNotFoundError`` if none is)."""
    return run_blocking(asummarize_dataset(url, storage_options, retry=retry))


async def asummarize_dataset(
    url: str, storage_options: dict[str, Any] | None = None, *, retry: RetryPolicy | None = None
) -> DatasetSummary:
    """``summarize_dataset`` for a running event loop."""
    store = open_store(url, storage_options)
    reader = RangeReader(store, retry=retry)
    try:
        try:
            (raw,) = await reader.fetch([ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)])
        except MissingObjectError as error:
            raise DatasetNotFoundError(
                f"no dataset at {url}: {ROOT_KEY} not found (never committed?)"
            ) from error
        if len(raw) > MAX_ROOT_BYTES:
            raise MetadataError(
                f"{store.describe(ROOT_KEY)} is larger than the {MAX_ROOT_BYTES}-byte cap"
            )
        manifest = parse_root(bytes(raw), store.describe(ROOT_KEY))
        with library_errors(f"listing {url}"):
            objects = await store.list_details(data_prefix(manifest.commit_id))
            for commit, shards in manifest.inherited.items():  # appended versions' old shards
                wanted = tuple(f"{shard_prefix(commit, s)}/" for s in shards)
                listed = await store.list_details(data_prefix(commit))
                objects = [*objects, *(o for o in listed if o.key.startswith(wanted))]
            garbage = await find_orphans(store, url)
    finally:
        if isinstance(store, LocalStore):
            store.close_files()
        else:
            await store.aclose()
    committed_at = manifest.extra.get("committed_at")
    previous = manifest.extra.get("previous_commit_id")
    return DatasetSummary(
        url=str(url),
        kind=manifest.kind,
        description=_KIND_WORDS.get(manifest.kind, "a kind this version does not know"),
        commit_id=manifest.commit_id,
        committed_at=committed_at if isinstance(committed_at, str) else None,
        previous_commit_id=previous if isinstance(previous, str) else None,
        shards=manifest.num_shards,
        schema=_schema_in_words(manifest),
        counts=_counts(manifest),
        stored_bytes=sum(info.size for info in objects),
        stored_objects=len(objects),
        orphans=[
            {"prefix": o.prefix, "bytes": o.bytes, "objects": o.objects}
            for o in [*garbage.orphans, *garbage.young]
        ],
    )


def _total(manifest: Manifest, name: str) -> int:
    return int(manifest.totals.get(name, 0))


def _counts(manifest: Manifest) -> dict[str, int]:
    shards = manifest.num_shards
    kind = manifest.kind
    if kind == "stream":
        return {
            "records": _total(manifest, "record_ends"),
            "elements": _total(manifest, "stream"),
        }
    if kind == "stream_with_meta":
        return {
            "records": _total(manifest, "record_ends"),
            "elements": _total(manifest, "stream"),
            "runs": max(0, _total(manifest, "runs") - shards),
            "payload bytes": _total(manifest, "payload_heap"),
        }
    if kind == "document":
        return {
            "documents": max(0, _total(manifest, "payload_offsets") - shards),
            "payload bytes": _total(manifest, "payload_heap"),
        }
    if kind == "temporal":
        counts = {"records": _total(manifest, "record_rows")}
        for name in manifest.arrays:
            if name != "record_rows":
                counts[f"rows of {name}"] = _total(manifest, name)
        return counts
    return {f"rows of {name}": _total(manifest, name) for name in manifest.arrays}


def _dtype_words(value: Any) -> str:
    try:
        dtype = dtype_from_json(value)
    except MetadataError:
        return repr(value)
    if dtype.names is None:
        return str(dtype.newbyteorder("="))
    parts = []
    for name in dtype.names:
        field_dtype = dtype.fields[name][0]  # type: ignore[index]
        base, shape = field_dtype.base, field_dtype.shape
        parts.append(f"{name} {base.newbyteorder('=')}{list(shape) if shape else ''}")
    return ", ".join(parts)


def _schema_in_words(manifest: Manifest) -> dict[str, Any]:
    schema = manifest.schema
    words: dict[str, Any] = {}
    if "stream_dtype" in schema:
        words["fields"] = _dtype_words(schema["stream_dtype"]).split(", ")
    fields = schema.get("fields")
    if manifest.kind == "temporal" and isinstance(fields, list):
        words["fields"] = [
            f"{item.get('name')} {_dtype_words(item.get('dtype'))}"
            f"{' x ' + str(item.get('shape')) if item.get('shape') else ''}"
            for item in fields
            if isinstance(item, dict)
        ]
        groups = schema.get("groups")
        if isinstance(groups, list):
            words["groups"] = [
                f"{group.get('array')}: {', '.join(map(str, group.get('fields') or []))}"
                for group in groups
                if isinstance(group, dict)
            ]
    if manifest.kind == "document":
        words["payload_encoding"] = schema.get(
            "payload_encoding", "not recorded (written before encodings were stored)"
        )
    return words
