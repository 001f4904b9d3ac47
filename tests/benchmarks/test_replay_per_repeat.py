"""The benchmark's S3 ceiling: each repeat's GETs replayed right after it, counted exactly.

A recorded "system" makes known range GETs through the latency proxy in a warm-up and two
repeats; the proxy recorder hands each phase to the replay service (``s3_ceiling.serve`` in
a thread) as it is cut. The replay must repeat exactly those GETs (keys, bytes) per repeat,
with each client, and none of its own GETs may leak into the system's recorded phases.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from benchmarks.s3_ceiling import CLIENTS, InlineReplay, repeat_ratios, serve
from benchmarks.s3env import BUCKET, ProxyRecorder, S3Environment, proxy_stats, s3_client

pytest.importorskip("obstore")
pytest.importorskip("aiohttp")

OBJECT = 1 << 20


def _system_gets(client, key: str, ranges: list[tuple[int, int]]) -> None:
    for a, b in ranges:
        got = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={a}-{b - 1}")
        assert len(got["Body"].read()) == b - a


def test_each_repeat_is_replayed_right_after_it_with_exactly_its_gets(tmp_path: Path) -> None:
    objects = tmp_path / "objects"
    (objects / "p").mkdir(parents=True)
    body = np.random.default_rng(0).integers(0, 256, OBJECT, dtype=np.uint8).tobytes()
    (objects / "p" / "blob.bin").write_bytes(body)
    with S3Environment(tmp_path, latency_ms=0) as env:
        endpoint = env.endpoint
        assert endpoint is not None
        env.upload_dir(objects / "p", "p")
        port_file = tmp_path / "port"
        spec = {
            "endpoint": endpoint.to_json(),
            "objects_root": str(objects),
            "port_file": str(port_file),
        }
        threading.Thread(target=serve, args=(spec, lambda _r: None), daemon=True).start()
        while not (port_file.exists() and port_file.read_text()):
            threading.Event().wait(0.02)
        client = s3_client(endpoint.proxy_url)
        warm = [(0, 100)]
        repeats = [[(1000, 5000), (7, 8), (OBJECT - 10, OBJECT)], [(0, OBJECT), (50, 60)]]
        windows = [6, 2]  # GETs per window 0.5 and 1.0: replayed 2 and 4 in flight at c=4
        recorder = ProxyRecorder(endpoint)
        recorder.start()
        session = InlineReplay(
            f"127.0.0.1:{port_file.read_text()}",
            {"system": "s", "label": "s", "workload": "w", "concurrency": 4},
        )
        recorder.after_cut = session
        before = proxy_stats(endpoint.stats_url)["requests"]
        recorder.restart()
        _system_gets(client, "p/blob.bin", warm)
        recorder.cut(0, 0.0)
        for ranges, n in zip(repeats, windows, strict=True):
            _system_gets(client, "p/blob.bin", ranges)
            recorder.cut(n, 0.5)
        rep = session.finish()
        requests = proxy_stats(endpoint.stats_url)["requests"] - before
        recorder.stop()

    # the system's phases hold its own GETs only (the replay's were dropped)
    served = [[tuple(e["served"]) for e in phase] for phase in recorder.phases]
    assert served == [warm, *repeats]
    assert rep["gets"] == [3, 2]
    assert rep["bytes"] == [sum(b - a for a, b in r) for r in repeats]
    assert rep["lanes"] == [2, 4]
    assert rep["verified"] is True
    for c in CLIENTS:
        assert len(rep["clients"][c]["seconds"]) == 2, rep["clients"][c]
    # requests the proxy saw: the system's 6, the 3 verified GETs, and per client the
    # warm-up topped up to 2 x lanes before each repeat whose lanes exceed any before it
    # (repeat 1: 1 recorded + 3 extra for 2 lanes; repeat 2: 1 + 7 for 4 lanes), then the
    # repeats' own 5 GETs
    per_client = (1 + 3) + (1 + 7) + 5
    assert requests == 6 + 3 + len(CLIENTS) * per_client
    # the ratio is per repeat: the system's repeat rate over the faster replay of it
    ratios = repeat_ratios(rep, [12.0, 4.0])
    best = [
        max(w / rep["clients"][c]["seconds"][k] for c in CLIENTS) for k, w in enumerate(windows)
    ]
    assert ratios == pytest.approx([12.0 / best[0], 4.0 / best[1]])
