"""A conversion killed at every step of the commit protocol loses nothing committed.

For each named kill point (``rangestream.storage.core.kill_points``), a dataset of two
committed versions (``v1``, then ``v2`` appended to it, so ``v2`` inherits ``v1``'s
shards) is overwritten by a ``convert`` child that SIGKILLs itself at that step. Then each
follow-up command runs on its own copy of the store as the kill left it: ``--resume``,
``--overwrite`` with an input that fails, ``--append``, ``gc --yes --grace 0``, ``verify``
and a plain rerun. After each, every version the root names as live (the committed one
and the one it replaced) reads back exactly, record by record, and ``verify`` finds no
damage; a command that cannot do its job refuses with a clear error instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.corpus import make_texts, write_jsonl
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.cli.main import main
from rangestream.io.process import run_blocking
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.stores import open_store
from rangestream.storage.core.kill_points import ENVIRONMENT, POINTS
from testkit import S3Endpoint

SEQ = StreamNumpyFormat(np.dtype([("sequence", "<u2")]))


def tokens(texts: list[str]) -> list[int]:
    """What the seq preset with the bytes tokenizer stores: UTF-8 bytes, then 256."""
    return [t for text in texts for t in [*text.encode(), 256]]


def store_flags(location: Location) -> list[str]:
    """``location``'s storage options as ``--storage-option`` flags."""
    flags: list[str] = []

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flags.extend(["--storage-option", f"{prefix}={json.dumps(value)}"])

    add("", location.storage_options)
    return flags


def run_cli(arguments: list[str]) -> tuple[int, str]:
    """``rangestream ...`` in this process: its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(arguments)
    return code, out.getvalue() + err.getvalue()


def retried_store(location: Location) -> RetryingStore:
    """The test's own reads and writes, retried as the library's are: a bare store's connect
    timeout on a loaded machine failed a copy (not the protocol under test) in a parallel run."""
    return RetryingStore(open_store(location.url, location.storage_options), RetryPolicy())


async def _copy(source: Location, target: Location, prefixes: tuple[str, ...] = ("",)) -> None:
    src, dst = retried_store(source), retried_store(target)
    slots = asyncio.Semaphore(32)

    async def one(key: str) -> None:
        async with slots:
            await dst.put(key, await src.get(key))

    try:
        keys = await src.list("")
        await asyncio.gather(*(one(key) for key in keys if key.startswith(prefixes)))
    finally:
        await src.aclose()
        await dst.aclose()


def copy_store(source: Location, target: Location, prefixes: tuple[str, ...] = ("",)) -> None:
    """Copy the objects of ``source`` (those under ``prefixes``) to ``target``."""
    run_blocking(_copy(source, target, prefixes))


def read_key(location: Location, key: str) -> bytes:
    async def get() -> bytes:
        store = retried_store(location)
        try:
            return await store.get(key)
        finally:
            await store.aclose()

    return run_blocking(get())


def put_key(location: Location, key: str, data: bytes) -> None:
    async def put() -> None:
        store = retried_store(location)
        try:
            await store.put(key, data)
        finally:
            await store.aclose()

    run_blocking(put())


def stored_tokens(location: Location) -> list[int]:
    storage = StreamStorage(location.url, SEQ, storage_options=location.storage_options)
    with storage.sync_reader() as reader:
        return reader.read(0, reader.total_length)["sequence"].tolist()


@dataclass
class Versions:
    """What every version written in a test must hold: its root document and tokens."""

    roots: dict[str, bytes] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def record(self, location: Location, want: list[int]) -> str:
        """Note the version committed at ``location`` now, which must hold ``want``."""
        root = read_key(location, "zarr.json")
        commit = json.loads(root)["attributes"]["rangestream"]["commit_id"]
        self.roots[commit], self.tokens[commit] = root, want
        return commit


def committed(location: Location) -> dict[str, Any]:
    return json.loads(read_key(location, "zarr.json"))["attributes"]["rangestream"]


def check_live_versions(
    location: Location, versions: Versions, scratch: Location, verify: bool = True
) -> None:
    """Every version the root names as live reads back exactly, and verify finds nothing."""
    root = committed(location)
    current = root["commit_id"]
    assert current in versions.tokens, f"an unknown version {current} was committed"
    assert stored_tokens(location) == versions.tokens[current]
    previous = root.get("extra", {}).get("previous_commit_id")
    if previous in versions.roots:
        # a reader that opened the replaced version before the commit still reads it all
        old = json.loads(versions.roots[previous])["attributes"]["rangestream"]
        needed = (previous, *old.get("inherited", {}))
        copy_store(location, scratch, tuple(f"data/{c}/" for c in needed))
        put_key(scratch, "zarr.json", versions.roots[previous])
        assert stored_tokens(scratch) == versions.tokens[previous]
    if verify:
        code, said = run_cli(["verify", location.url, *store_flags(location)])
        assert code == 0, said


@dataclass
class Scene:
    location: Location
    inputs: dict[str, str]
    texts: dict[str, list[str]]
    versions: Versions

    def convert(self, name: str, *flags: str, at: Location | None = None) -> tuple[int, str]:
        where = at or self.location
        return run_cli(
            ["convert", self.inputs[name], "--to", where.url, "--preset", "seq", "--tokenizer",
             "bytes", "--workers", "0", "--no-progress", "--split-bytes", "300", *flags,
             *store_flags(where)]
        )  # fmt: skip


def make_scene(location: Location, tmp_path: Path) -> Scene:
    texts = {name: make_texts(5, seed=seed) for seed, name in enumerate("ABCD")}
    texts["BAD"] = ["fine"]
    inputs = {name: str(write_jsonl(tmp_path / f"{name}.jsonl", [{"text": t} for t in rows]))
              for name, rows in texts.items()}  # fmt: skip
    bad = Path(inputs["BAD"])
    bad.write_text(bad.read_text() + '{"text": 5}\n')
    scene = Scene(location, inputs, texts, Versions())
    assert scene.convert("A")[0] == 0
    scene.versions.record(location, tokens(texts["A"]))
    assert scene.convert("B", "--append")[0] == 0
    scene.versions.record(location, tokens(texts["A"] + texts["B"]))
    return scene


@pytest.fixture(scope="module")
def local_template(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """The two committed versions on local disk, written once for the module's cases."""
    base = tmp_path_factory.mktemp("kill-points-template")
    return make_scene(Location(str(base / "ds"), {}), base)


@pytest.fixture(scope="module")
def s3_template(
    s3_server: S3Endpoint, s3_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> Scene:
    """The two committed versions on S3, written once for the module's cases."""
    url = f"s3://{s3_bucket}/kill-points-template-{uuid.uuid4().hex[:8]}/ds"
    base = tmp_path_factory.mktemp("kill-points-template-s3")
    return make_scene(Location(url, s3_server.storage_options), base)


def scene_copy(template: Scene, location: Location) -> Scene:
    """``template``'s dataset copied to ``location``: the same objects, so the same
    committed versions (ids, roots, tokens); inputs and texts are only read."""
    copy_store(template.location, location)
    scene = copy.deepcopy(template)
    scene.location = location
    assert committed(location) == committed(template.location)
    return scene


def kill_convert(scene: Scene, point: str) -> None:
    """Overwrite the dataset with input C in a child that SIGKILLs itself at ``point``."""
    location = scene.location
    child = subprocess.run(
        [sys.executable, "-c", "from rangestream.cli.main import main; raise SystemExit(main())",
         "convert", scene.inputs["C"], "--to", location.url, "--preset", "seq", "--tokenizer",
         "bytes", "--workers", "0", "--no-progress", "--split-bytes", "300", "--overwrite",
         *store_flags(location)],
        capture_output=True, text=True, timeout=120, env={**os.environ, ENVIRONMENT: point},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr


FOLLOW_UPS = ("resume", "overwrite-failing", "append", "gc", "verify", "rerun")


def follow_up(scene: Scene, name: str, before: str) -> None:
    """Run follow-up ``name`` on ``scene``; ``before``: the version committed after the kill."""
    location, texts = scene.location, scene.texts
    if name == "resume":
        code, said = scene.convert("C", "--overwrite", "--resume")
        assert code == 0, said
        # the killed overwrite is complete now: the dataset is C, whatever step it died at
        if committed(location)["commit_id"] not in scene.versions.tokens:
            scene.versions.record(location, tokens(texts["C"]))
        assert stored_tokens(location) == tokens(texts["C"])
    elif name == "overwrite-failing":
        code, said = scene.convert("BAD", "--overwrite")
        assert code == 2 and "BAD.jsonl:2" in said and "--skip-bad" in said, said
        assert committed(location)["commit_id"] == before  # nothing replaced on failure
    elif name == "append":
        code, said = scene.convert("D", "--append")
        assert code == 0, said
        scene.versions.record(location, scene.versions.tokens[before] + tokens(texts["D"]))
    elif name == "gc":
        code, said = run_cli(["gc", location.url, "--yes", "--grace", "0", *store_flags(location)])
        assert code == 0, said
        assert committed(location)["commit_id"] == before
    elif name == "verify":
        code, said = run_cli(["verify", location.url, *store_flags(location)])
        assert code == 0, said
    elif name == "rerun":
        code, said = scene.convert("C")
        assert code == 2 and "already holds a committed dataset" in said, said
        assert "--overwrite" in said and "--append" in said and "overwrite=True" not in said
        assert committed(location)["commit_id"] == before


@pytest.mark.parametrize("point", POINTS)
def test_a_convert_killed_at_each_step_loses_nothing_committed(
    point: str, location: Location, request: pytest.FixtureRequest
) -> None:
    template: Scene = request.getfixturevalue("s3_template" if location.is_s3 else "local_template")
    scene = scene_copy(template, Location(location.child("ds"), location.storage_options))
    kill_convert(scene, point)
    if point in ("root-published", "committed"):
        # the kill came after the publication: C is a committed version
        scene.versions.record(scene.location, tokens(scene.texts["C"]))
    before = committed(scene.location)["commit_id"]
    check_live_versions(
        scene.location,
        scene.versions,
        Location(location.child("scratch"), location.storage_options),
    )
    killed = scene.location
    for number, name in enumerate(FOLLOW_UPS):
        copy = killed  # the follow-ups that change nothing run on the killed state itself
        if name not in ("verify", "rerun"):
            copy = Location(location.child(f"after-{name}"), location.storage_options)
            copy_store(killed, copy)
        scene.location = copy
        follow_up(scene, name, before)
        scratch = Location(location.child(f"scratch{number}"), location.storage_options)
        check_live_versions(copy, scene.versions, scratch, verify=name != "verify")


def test_gc_keeps_a_killed_write_while_its_lease_holds_and_a_resume_never_commits_a_hole(
    tmp_path: Path,
) -> None:
    location = Location(str(tmp_path / "ds"), {})
    scene = make_scene(location, tmp_path)
    kill_convert(scene, "part-written")
    session = json.loads(read_key(location, "in_progress/session.json"))
    prefix = f"data/{session['commit_id']}"
    code, said = run_cli(["gc", location.url, "--yes", "--grace", "0", "--json"])
    assert code == 0 and prefix in [o["prefix"] for o in json.loads(said)["young"]], said
    # a block of the written split goes missing (a gc killed mid-way, a hand-made rm):
    # the resumed commit refuses rather than publish a version with a hole
    block = sorted((tmp_path / "ds" / prefix / "shards").rglob("c/0"))[0]
    block.unlink()
    code, said = scene.convert("C", "--overwrite", "--resume")
    assert code == 2 and "the store does not hold" in said and "--resume" in said, said
    check_live_versions(location, scene.versions, Location(str(tmp_path / "scratch"), {}))
    # the lease ends (no heartbeat for long): gc collects the write, a resume redoes it
    session["heartbeat"] -= 10 * session["lease_seconds"]
    put_key(location, "in_progress/session.json", json.dumps(session).encode())
    code, said = run_cli(["gc", location.url, "--yes", "--grace", "0", "--json"])
    assert code == 0 and prefix in [o["prefix"] for o in json.loads(said)["orphans"]], said
    code, said = scene.convert("C", "--overwrite", "--resume")
    assert code == 0, said
    scene.versions.record(location, tokens(scene.texts["C"]))
    check_live_versions(location, scene.versions, Location(str(tmp_path / "scratch2"), {}))
