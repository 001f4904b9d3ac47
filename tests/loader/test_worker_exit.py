"""Workers end within seconds of their main process's death, whatever killed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage

MAIN = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys, time
    from rangestream import StatefulDataLoader, StreamStorage

    path, how, method = sys.argv[1:4]
    loader = StatefulDataLoader.from_storage(
        StreamStorage(path), sequence_length=256, batch_size=4, num_workers=2,
        shuffle=False, prefetch_factor=64, multiprocessing_context=method,
    )
    batches = iter(loader)
    next(batches)
    next(batches)
    print(json.dumps([child.pid for child in multiprocessing.active_children()]), flush=True)
    time.sleep(1.0)  # the workers fill their queue, which nobody reads from now on
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("how", "method"), [("exit", "fork"), ("sigkill", "fork"),
                                             ("sigkill", "forkserver")])  # fmt: skip
def test_workers_end_within_10_s_of_the_main_process(tmp_path: Path, how: str, method: str) -> None:
    storage = StreamStorage(tmp_path / "s", StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(2**18, dtype=np.uint32).astype("<u2")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    main = subprocess.Popen(
        [sys.executable, "-c", MAIN, str(tmp_path / "s"), how, method],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert main.stdout is not None
    workers = json.loads(main.stdout.readline())
    assert len(workers) >= 2
    main.wait(timeout=60)
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in workers if not gone(pid)]
    for pid in alive:  # leave nothing behind, then fail
        os.kill(pid, 9)
    assert alive == [], f"workers {alive} outlived their main process ({how}, {method})"
