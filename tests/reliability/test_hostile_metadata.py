"""Hostile and broken metadata is refused with the library's own errors; secrets stay secret.

Fuzzing (hypothesis) covers the root ``zarr.json`` (random JSON, and valid manifests
mutated: wrong types, huge and negative numbers, deep nesting, huge and object dtypes,
bad commit ids, ``..`` and absolute paths wherever a string becomes a key), array
layouts, dtypes, chunk indexes and block contents. Every case must end in a
``RangestreamError`` (or succeed), with bounded store requests, bytes read and memory, and
no object outside the dataset may be opened. Counts, not seconds: what hostile metadata
could do is make the reader request or allocate what it claims instead of what is stored,
which these bounds catch exactly whatever the machine's load; a case that hangs without
either is caught by the per-test timeout (``HANG_GUARD``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import os
import pickle
import pickletools
import socket
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location

from rangestream import DocumentPickleFormat, DocumentStorage, RetryPolicy, StreamStorage
from rangestream.errors import (
    EndpointUnreachableError,
    MetadataError,
    RangestreamError,
    StorageError,
    UnsafeKeyError,
)
from rangestream.io import FsspecStore, LocalStore, open_store
from rangestream.io.store import check_key
from rangestream.layout.block import ArrayLayout, encode_block, parse_block_index
from rangestream.layout.checksums import check_span, crc32c
from rangestream.layout.dtypes import dtype_from_json
from rangestream.layout.manifest_parsing import parse_root
from rangestream.layout.pieces import indexed_spans
from rangestream.storage.maintenance.verify import verify_dataset
from testkit import S3Endpoint

from .datasets import SMALL, BytesFormat, RawObjects, tokens_storage, write_documents, write_tokens

#: Bytes one fuzz case may allocate at its peak, whatever the metadata claims.
MEMORY_BOUND = 32 * 1024 * 1024
#: Seconds a fuzz test may run, its hundreds of cases together, before pytest-timeout stops
#: it: the guard against a case that hangs without requesting or allocating anything (a
#: loop over a claimed count). Generous: these tests take well under a minute, even loaded.
HANG_GUARD = pytest.mark.timeout(240)
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# -- strategies ---------------------------------------------------------------------------

HOSTILE_STRINGS = [
    "..",
    "../..",
    "../../victim",
    "/etc/passwd",
    "/",
    "data/../../x",
    "a/../../b",
    "\\\\server\\share",
    "C:\\windows",
    "\x00",
    "",
    "stream/../../..",
    "0" * 32,
    "f" * 31,
    "g" * 32,
    "data/" + "0" * 32,
    "x" * 100_000,
]
HOSTILE_DTYPES: list[Any] = [
    "O",
    "|O",
    "<U10",
    "|S5",
    "<M8[ns]",
    "V100000000",
    "<i4" * 1000,
    [["a", "O"]],
    [["a", "<i4", [1 << 20, 1 << 20]]],
    [["a", "<i4", [-1]]],
    [["a", [["b", [["c", "O"]]]]]],
    [["", "<i4"], ["", "<i4"]],
    [["a", "<i4"], ["a", "<i4"]],
    [[1, 2]],
    [["a"]],
    [],
    "<i" + "9" * 30,
]
HUGE_NUMBERS = [10**15, 2**50, 2**62, 2**63, 2**64, -(2**63) - 1, 10**400, -1, -(10**15)]


class Raw:
    """JSON text spliced in verbatim (nesting deeper than ``json.dumps`` would write)."""

    def __init__(self, text: str) -> None:
        self.text = text


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
hostile_values = st.one_of(
    json_values,
    st.sampled_from(HOSTILE_STRINGS),
    st.sampled_from(HOSTILE_DTYPES),
    st.sampled_from(HUGE_NUMBERS),
    st.integers(2, 5000).map(lambda depth: Raw("[" * depth + "]" * depth)),
    st.integers(2, 5000).map(lambda depth: Raw('{"a":' * depth + "1" + "}" * depth)),
    st.lists(st.sampled_from(HUGE_NUMBERS), min_size=1, max_size=5),
).map(copy.deepcopy)  # sampled lists are shared: a mutation must not alter (or nest) them


def dumps(document: Any) -> bytes:
    """JSON of ``document`` with ``Raw`` values spliced in (NaN and infinities allowed)."""
    raws: list[str] = []

    def default(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"__raw_{len(raws) - 1}__"
        raise TypeError(type(value).__name__)

    text = json.dumps(document, default=default)
    for number, raw in enumerate(raws):
        text = text.replace(f'"__raw_{number}__"', raw, 1)
    return text.encode()


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (dict keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


@st.composite
def mutated(draw: st.DrawFn, document: dict[str, Any]) -> bytes:
    """``document`` with one to three values replaced, deleted or keys renamed."""
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(sorted(paths(document), key=repr)))
        if not path:
            document = draw(hostile_values)
            break
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "rename"]))
        if action == "replace":
            parent[last] = draw(hostile_values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[last]
        elif action == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(HOSTILE_STRINGS[:8]) | st.text(max_size=8))] = parent.pop(
                last
            )
        else:
            parent[last] = draw(hostile_values)
        if not isinstance(document, (dict, list)):
            break
    return dumps(document)


# -- harness -------------------------------------------------------------------------------


class StoreCounts:
    """Requests every ``LocalStore`` answers and the bytes it returns (a mapped block counts
    as a request for its file's bytes): what one fuzz case costs the store, exactly."""

    READS = ("get_range_sync", "get_suffix_sync", "get_sync", "_get_versioned_sync")
    CALLS = ("size", "exists", "list", "list_details", "list_prefixes", "put_sync")

    def __init__(self) -> None:
        self.requests = 0
        self.nbytes = 0

    def reset(self) -> None:
        self.requests = self.nbytes = 0

    def install(self, patch: pytest.MonkeyPatch) -> None:
        for name in (*self.READS, *self.CALLS, "local_path"):
            patch.setattr(LocalStore, name, self._counting(name, getattr(LocalStore, name)))

    def _counting(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        counts = self
        if inspect.iscoroutinefunction(method):

            async def counted_call(store: LocalStore, *args: Any, **kwargs: Any) -> Any:
                counts.requests += 1
                return await method(store, *args, **kwargs)

            return counted_call

        def counted(store: LocalStore, *args: Any, **kwargs: Any) -> Any:
            counts.requests += 1
            out = method(store, *args, **kwargs)
            if name == "local_path":
                with contextlib.suppress(OSError):  # a missing file is mapped by nobody
                    counts.nbytes += os.stat(out).st_size
            elif name in self.READS:
                counts.nbytes += len(out[0] if isinstance(out, tuple) else out)
            return out

        return counted


def stored(root: Path | None) -> tuple[int, int]:
    """Objects and bytes under ``root`` as the case finds it (its hostile root included)."""
    if root is None:
        return 0, 0
    sizes = [
        os.stat(os.path.join(folder, name)).st_size
        for folder, _, names in os.walk(root)
        for name in names
        if os.path.isfile(os.path.join(folder, name))
    ]
    return len(sizes), sum(sizes)


class Bounded:
    """Runs one fuzz case: only ``RangestreamError`` may escape; requests, bytes read and
    memory bounded.

    A case reading dataset ``root`` (an open, three reads and a full verify, each a case of
    its own) may make at most two requests per stored object plus a few, and read each
    stored byte at most twice: a verify reads every object once, an open reads the root
    and the shard table. Hostile numbers (a billion shards, a block 2**62 bytes long) must
    not turn into requests or reads of what is claimed. A case without ``root`` (parsing
    alone) makes no request at all. Memory is traced during the case only (tracing
    hypothesis itself would triple the suite's time); numpy reports its buffers to
    tracemalloc too.
    """

    def __init__(self, counts: StoreCounts) -> None:
        self.cases = 0
        self.counts = counts

    def __call__(self, case: Callable[[], Any], root: Path | None = None) -> None:
        objects, nbytes = stored(root)
        self.counts.reset()
        tracemalloc.start()
        try:
            case()
        except RangestreamError as error:
            assert str(error), f"{type(error).__name__} without a message"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        requests, read = self.counts.requests, self.counts.nbytes
        assert requests <= 2 * objects + 4, f"{requests} requests for {objects} objects"
        assert read <= 2 * nbytes, f"{read} bytes read of {nbytes} stored"
        assert peak < MEMORY_BOUND, f"case allocated {peak / 2**20:.1f} MiB at its peak"
        self.cases += 1


@pytest.fixture(scope="module")
def bounded() -> Iterator[Bounded]:
    counts = StoreCounts()
    with pytest.MonkeyPatch.context() as patch:
        counts.install(patch)
        yield Bounded(counts)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile")
    # few objects, so that each case (open, reads, a full verify) takes milliseconds
    layout = {"chunk_bytes": 64, "block_bytes": 4096}
    write_tokens(str(base / "tokens"), seed=1, tokens_per_shard=2_000, **layout)
    write_documents(str(base / "documents"), seed=2, count=60, **layout)
    return {"tokens": base / "tokens", "documents": base / "documents"}


@pytest.fixture
def opened_paths(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every local path a store resolves a key to, to prove none leaves its dataset."""
    seen: list[Path] = []
    original = LocalStore._path

    def record(store: LocalStore, key: str) -> Path:
        path = original(store, key)
        seen.append(path)
        return path

    monkeypatch.setattr(LocalStore, "_path", record)
    return seen


def exercise_tokens(path: Path) -> None:
    with tokens_storage(str(path)).sync_reader() as reader:
        total = reader.total_length
        reader.num_records(0)
        for start in (0, total // 2, total - 50):
            if start >= 0 and start + 50 <= total:
                reader.read(start, 50)


def exercise_documents(path: Path) -> None:
    with DocumentStorage(str(path), BytesFormat()).sync_reader() as reader:
        count = len(reader)
        for index in (0, count // 2, count - 1):
            if 0 <= index < count:
                reader.read(index)


def assert_inside(paths_seen: list[Path], root: Path) -> None:
    for path in paths_seen:
        assert path.resolve().is_relative_to(root.resolve()), f"{path} is outside {root}"


# -- fuzzing -------------------------------------------------------------------------------


@HANG_GUARD
@settings(FUZZ, max_examples=1500)
@given(document=json_values | hostile_values)
def test_random_json_as_the_root_document_is_refused_with_a_metadata_error(
    bounded: Bounded, document: Any
) -> None:
    raw = dumps({"zarr_format": 3, "node_type": "group", "attributes": {"rangestream": document}})
    bounded(lambda: parse_root(raw, "fuzz/zarr.json"))
    bounded(lambda: parse_root(dumps(document), "fuzz/zarr.json"))


@HANG_GUARD
@pytest.mark.parametrize("kind", ["tokens", "documents"])
def test_mutated_manifests_end_in_library_errors_and_never_leave_the_dataset(
    bounded: Bounded, datasets: dict[str, Path], opened_paths: list[Path], kind: str
) -> None:
    root = datasets[kind]
    raw = RawObjects(str(root))
    original = raw.root()
    exercise = exercise_tokens if kind == "tokens" else exercise_documents

    @settings(FUZZ, max_examples=700)
    @given(document=mutated(original))
    def run(document: bytes) -> None:
        (root / "zarr.json").write_bytes(document)
        bounded(lambda: exercise(root), root)
        bounded(lambda: verify_dataset(str(root)), root)

    try:
        run()
    finally:
        raw.put_root(original)
    assert_inside(opened_paths, root)
    exercise(root)  # the dataset itself was never damaged by the cases


@HANG_GUARD
@settings(FUZZ, max_examples=600)
@given(
    layout=st.fixed_dictionaries(
        {},
        optional={
            "dtype": hostile_values | st.sampled_from(["<i4", "|u1", [["a", "<f8"]]]),
            "row_shape": hostile_values | st.lists(st.integers(-5, 1 << 30), max_size=10),
            "chunk_rows": hostile_values | st.integers(-5, 1 << 45),
            "block_rows": hostile_values | st.integers(-5, 1 << 45),
            "dense_chunks": hostile_values,
        },
    )
    | hostile_values
)
def test_array_layouts_and_dtypes_are_parsed_or_refused(bounded: Bounded, layout: Any) -> None:
    bounded(lambda: ArrayLayout.from_json(layout, "fuzz layout"))
    if isinstance(layout, dict) and "dtype" in layout:
        bounded(lambda: dtype_from_json(layout["dtype"], "fuzz dtype"))


LAYOUT = ArrayLayout(np.dtype("<i8"), (), 8, 64)


@HANG_GUARD
@settings(FUZZ, max_examples=600)
@given(raw=st.binary(max_size=2 * LAYOUT.index_nbytes), entries=st.lists(st.integers(0, 2**64 - 1)))
def test_chunk_indexes_and_chunks_of_random_bytes_are_refused(
    bounded: Bounded, raw: bytes, entries: list[int]
) -> None:
    bounded(lambda: parse_block_index(LAYOUT, raw, "fuzz index"))
    bounded(lambda: check_span(raw, LAYOUT.stored_chunk_nbytes, 0, lambda: "fuzz chunks"))
    # a well-formed index (valid checksum) whose entries are arbitrary
    body = np.resize(np.asarray(entries or [0], dtype="<u8"), 2 * LAYOUT.chunks_per_block)
    index_bytes = body.tobytes() + crc32c(body.tobytes()).to_bytes(4, "little")
    index = parse_block_index(LAYOUT, index_bytes, "fuzz index")
    bounded(lambda: indexed_spans(LAYOUT, index, 0, LAYOUT.chunks_per_block - 1, "fuzz"))


@HANG_GUARD
@pytest.mark.parametrize("kind", ["tokens", "documents"])
def test_damaged_or_hostile_block_contents_end_in_library_errors(
    bounded: Bounded, datasets: dict[str, Path], kind: str
) -> None:
    root = datasets[kind]
    raw = RawObjects(str(root))
    name = "record_ends" if kind == "tokens" else "payload_offsets"
    layout = raw.layout(name)
    targets = [raw.block_key(shard, name, 0) for shard in (0, 1)]
    targets += [raw.block_key(0, "stream" if kind == "tokens" else "payload_heap", 1)]
    originals = {key: raw.get(key) for key in targets}
    exercise = exercise_tokens if kind == "tokens" else exercise_documents

    @settings(FUZZ, max_examples=250)
    @given(
        key=st.sampled_from(targets),
        damage=st.sampled_from(["values", "flip", "cut", "extend", "bytes"]),
        values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40),
        position=st.integers(0, 10_000),
        noise=st.binary(max_size=3000),
    )
    def run(key: str, damage: str, values: list[int], position: int, noise: bytes) -> None:
        data = originals[key]
        if damage == "values" and name in key:  # checksums valid, numbers hostile
            rows = np.asarray(values[: layout.block_rows], dtype="<i8")
            data = encode_block(layout, rows.view(np.uint8))
        elif damage == "flip":
            flipped = bytearray(data)
            flipped[position % len(flipped)] ^= 1 << (position % 8)
            data = bytes(flipped)
        elif damage == "cut":
            data = data[: position % len(data)]
        elif damage == "extend":
            data = data + noise
        else:
            data = noise
        raw.put(key, data)
        try:
            bounded(lambda: exercise(root), root)
            bounded(lambda: verify_dataset(str(root)), root)
        finally:
            raw.put(key, originals[key])

    run()
    exercise(root)


# -- pickle --------------------------------------------------------------------------------


def test_opening_and_reading_a_stream_dataset_never_unpickles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_tokens(str(tmp_path / "ds"), seed=3, tokens_per_shard=3_000, **SMALL)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle was used on the metadata or read path")

    for module, names in (
        (pickle, ["loads", "load", "Unpickler"]),
        (pickletools, ["dis", "genops", "optimize"]),
    ):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    with pytest.raises(AssertionError, match="pickle was used"):
        pickle.loads(b"")  # the trap is armed

    with data.storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(100, 4000)["tokens"], data.tokens[100:4100])

    async def read_async() -> Any:
        async with data.storage.async_reader() as reader:
            return await reader.read(7, 50)

    np.testing.assert_array_equal(asyncio.run(read_async())["tokens"], data.tokens[7:57])
    assert verify_dataset(data.storage.url).ok


def test_the_pickle_format_is_documented_as_for_trusted_data_only() -> None:
    import rangestream.formats.document_pickle as module

    for text in (module.__doc__, DocumentPickleFormat.__doc__, DocumentStorage.__doc__):
        assert text is not None and "trust" in text.lower()


# -- credentials ---------------------------------------------------------------------------

SECRET = "s3cr3t-VALUE-9f8e7d6c5b4a"


def assert_secret_absent(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


def error_texts(error: BaseException) -> list[str]:
    """The error and everything it was raised from, as a user would see them printed."""
    import traceback

    texts = ["".join(traceback.format_exception(error))]
    seen: BaseException | None = error
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return texts


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_credentials_never_appear_in_reprs_errors_or_logs(
    s3_server: S3Endpoint, s3_url: Location, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger: rangestream, s3fs, fsspec, botocore
    write_tokens(s3_url.url, s3_url.storage_options, seed=4, tokens_per_shard=500, **SMALL)
    policy = RetryPolicy(max_attempts=2, base_delay=0.01, request_timeout=5, total_timeout=10)
    unreachable = {
        "key": s3_server.access_key,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{closed_port()}"},
        "config_kwargs": {"connect_timeout": 0.5},
    }
    wrong_secret = {**s3_url.storage_options, "secret": SECRET}
    for options, expected in (
        (unreachable, EndpointUnreachableError),
        (wrong_secret, PermissionError),  # the server refuses the signature: 403
    ):
        storage = StreamStorage(s3_url.url, tokens_storage(s3_url.url).storage_format,
                                storage_options=options, retry=policy)  # fmt: skip
        assert_secret_absent(repr(storage), str(storage), repr(storage.new_store()))
        with pytest.raises(StorageError) as caught:
            storage.sync_reader().__enter__()
        assert isinstance(caught.value, expected) or isinstance(caught.value.__cause__, expected)
        assert f"{s3_url.url}/zarr.json" in str(caught.value)
        assert_secret_absent(*error_texts(caught.value))
    assert caplog.records, "nothing was logged at DEBUG: the check would be empty"
    assert_secret_absent(caplog.text, *(str(record.args) for record in caplog.records))


# -- keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["../x", "a/../../x", "/etc/passwd", "data/./x", "data//x", "..", "a\\..\\b", "x\x00"],
)
@pytest.mark.parametrize("url", ["local", "memory://rangestream-keys/ds"])
def test_a_key_that_would_leave_the_dataset_is_refused_before_any_io(
    tmp_path: Path, key: str, url: str
) -> None:
    store = open_store(str(tmp_path / "ds") if url == "local" else url)
    with pytest.raises(UnsafeKeyError, match="would leave the dataset root"):
        check_key(key)
    for call in (store.get, store.exists, store.list, store.delete_prefix):

        async def attempt(call: Callable[[str], Any] = call) -> Any:
            return await call(key)

        with pytest.raises(UnsafeKeyError):
            asyncio.run(attempt())
    with pytest.raises(UnsafeKeyError):
        asyncio.run(store.put(key, b"x"))
    assert isinstance(store, (LocalStore, FsspecStore))


def test_overwriting_a_dataset_whose_manifest_names_a_hostile_old_version_deletes_nothing_outside(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    url = str(tmp_path / "ds")
    write_tokens(url, seed=5, tokens_per_shard=500, **SMALL)
    raw = RawObjects(url)
    for hostile in ("../../victim", "", "/tmp", "0" * 31 + "/"):
        root = raw.root()
        root["attributes"]["rangestream"]["extra"] = {"previous_commit_id": hostile}
        raw.put_root(root)
        with pytest.raises(MetadataError, match="previous_commit_id"):
            parse_root(raw.get("zarr.json"), "zarr.json")
        write_tokens(url, seed=6, tokens_per_shard=500, overwrite=True, **SMALL)
        assert (victim / "precious.txt").read_text() == "keep me"
        assert verify_dataset(url).ok
