"""What every scale series shares: where data goes, timing, subprocess measures, kinds.

Every storage kind is made here with a tiny format of its own, so the series measure the
library's fixed costs (opening, locating, per-shard overheads), not a format's work.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "benchmarks" / ".work" / "scale"

KINDS = ("stream", "document", "stream_with_meta", "temporal")


def work_dir(label: str, *parts: str) -> Path:
    path = WORK.joinpath(label, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def save(label: str, series: str, result: Any) -> Path:
    path = work_dir(label) / f"{series}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True))
    return path


def spread(values: Iterable[float]) -> dict[str, float]:
    """Median and range of repeated measures."""
    values = sorted(values)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Seconds per call of ``fn``: median and range over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return spread(times)


def in_subprocess(function: str, *args: Any, env: dict[str, str] | None = None) -> Any:
    """``function(*args)`` (``module:name``) run in a fresh interpreter; its JSON result.

    Memory is measured in a process of its own, so imports, caches and allocator state of
    earlier measures do not blur it.
    """
    module, name = function.split(":")
    code = (
        "import json, sys\n"
        f"from {module} import {name}\n"
        f"result = {name}(*json.loads(sys.argv[1]))\n"
        "sys.stdout.write('\\n@@' + json.dumps(result))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{function}{args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.rsplit("\n@@", 1)[1])


def code_version() -> str:
    """Where the measured library comes from (an old checkout via PYTHONPATH, or this tree)."""
    import rangestream

    return str(Path(rangestream.__file__).resolve().parents[1])


# -- the kinds, with tiny formats ------------------------------------------------------------
class RawDocuments:
    """Documents that are their own bytes."""

    payload_encoding = "raw"

    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, data: bytes, shard: int) -> bytes:
        return data


class Spans:
    """A stream with metadata: each record is one run with one payload."""

    def __init__(self) -> None:
        self.stream_dtype = np.dtype("<i4")

    def size(self, data: tuple[np.ndarray, bytes]) -> int:
        return len(data[0])

    def pack(self, data: tuple[np.ndarray, bytes]) -> Generator[tuple[Any, Any], None, np.ndarray]:
        tokens, payload = data
        for i in range(len(tokens)):
            yield 0, payload if i == 0 else None
        return tokens

    def unpack(self, stream: Any, shards: Any, index: Any, payloads: Any) -> Any:
        return stream, payloads


def storage(kind: str, url: str, **options: Any) -> Any:
    import rangestream as rs

    if kind == "stream":
        return rs.StreamStorage(url, rs.StreamNumpyFormat(np.dtype([("t", "<i4")])), **options)
    if kind == "document":
        return rs.DocumentStorage(url, RawDocuments(), **options)
    if kind == "stream_with_meta":
        return rs.StreamWithMetaStorage(url, Spans(), **options)
    if kind == "temporal":
        return rs.TemporalArrayStorage(url, **options)
    raise ValueError(kind)


def record(kind: str, i: int) -> Any:
    """A tiny record of ``kind`` (one element, one frame, eight bytes)."""
    if kind == "stream":
        return {"t": np.full(1, i, dtype="<i4")}
    if kind == "document":
        return i.to_bytes(8, "little")
    if kind == "stream_with_meta":
        return (np.full(1, i, dtype="<i4"), i.to_bytes(8, "little"))
    if kind == "temporal":
        return {"x": np.full((1, 2), i, dtype="<f4")}
    raise ValueError(kind)


def claim(kind: str) -> dict[str, int]:
    """Per-array rows of a shard holding one tiny record (what a part manifest lists)."""
    return {
        "stream": {"stream": 1, "record_ends": 1},
        "document": {"payload_heap": 8, "payload_offsets": 2},
        "stream_with_meta": {
            "stream": 1, "record_ends": 1, "runs": 2, "payload_heap": 8, "run_index": 1,
        },
    }[kind]  # fmt: skip


def first_read(kind: str, reader: Any) -> Any:
    """The first record's read on an open reader (window, document or frames)."""
    if kind in ("stream", "stream_with_meta"):
        return reader.read(0, 1)
    if kind == "document":
        return reader.read(0)
    return reader.read_window(0, 0, 1)


def reader_of(kind: str, url: str) -> Any:
    return storage(kind, url).sync_reader()


def write_records(kind: str, url: str, records: int, shards: int, **options: Any) -> None:
    """``records`` tiny records dealt to ``shards`` shards in order (shard-major)."""
    target = storage(kind, url, **options)
    per_shard = -(-records // shards)
    with target.sync_writer(overwrite=True) as writer:
        for i in range(records):
            writer.append(i // per_shard, record(kind, i))


def write_claimed(
    kind: str, url: str, shards: int, real: int, storage_options: dict[str, Any] | None = None
) -> None:
    """A dataset of ``shards`` one-record shards of which only the first ``real`` hold objects.

    The others are listed by a part manifest as a writer would list them, so the commit,
    the root and the index are exactly those of ``shards`` written shards; reads must stay
    within the first ``real`` shards. Used where writing every shard for real would take the
    series longer than it measures anything (opening reads only the root and the index).
    """
    import rangestream as rs  # noqa: F401 - the kinds register their classes

    options = {"storage_options": storage_options} if storage_options else {}
    target = storage(kind, url, **options)
    session = target.parallel_write(overwrite=True)
    with session.sync_writer(part_id="written") as writer:
        for shard in range(min(real, shards)):
            writer.append(shard, record(kind, shard))
    lengths = claim(kind)
    part = {
        "part_id": "claimed",
        "shards": {str(s): lengths for s in range(min(real, shards), shards)},
    }
    put(target, f"{session.prefix}/parts/claimed.json", json.dumps(part).encode())
    session.commit(check_objects=False)  # the claimed shards hold no objects


def put(target: Any, key: str, data: bytes) -> None:
    from rangestream.io.process import run_blocking

    store = target.new_write_store()

    async def go() -> None:
        try:
            await store.put(key, data)
        finally:
            await store.aclose()

    run_blocking(go())


def directory_bytes(path: Path) -> tuple[int, int, int]:
    """``(files, bytes, bytes allocated on disk)`` under ``path``."""
    files = logical = allocated = 0
    for item in path.rglob("*"):
        if item.is_file():
            info = item.stat()
            files += 1
            logical += info.st_size
            allocated += info.st_blocks * 512
    return files, logical, allocated
