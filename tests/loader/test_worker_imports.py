"""What workers import is imported once ahead of them: with ``forkserver``, by the server.

Each probe runs in a fresh interpreter started with ``-c``: its ``__main__`` has no file, so
the forkserver's default preload (``["__main__"]``) imports nothing, as under ``python -m``,
a notebook or pytest. Whether the server imported torch and numpy's random module is read
from its memory map (their compiled libraries), after a worker was forked from it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage

SERVER_MAPS = """
import multiprocessing.forkserver
server = multiprocessing.forkserver._forkserver
with open(f"/proc/{server._forkserver_pid}/maps") as maps:
    mapped = maps.read()
print("libtorch" in mapped, "numpy/random" in mapped, server._preload_modules)
"""

LOADER_PROBE = """
import sys
import numpy as np
from rangestream import StatefulDataLoader, StreamStorage
loader = StatefulDataLoader.from_storage(StreamStorage(sys.argv[1]), sequence_length=10,
    batch_size=3, num_workers=2, multiprocessing_context="forkserver", rank=0, world_size=1)
assert sum(1 for _ in loader) == 5
"""

TORCH_PROBE = """
import torch.utils.data
loader = torch.utils.data.DataLoader(list(range(6)), num_workers=2,
                                     multiprocessing_context="forkserver")
assert sum(1 for _ in loader) == 6
"""


def server_imports(probe: str, *args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", probe + SERVER_MAPS, *args],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return result.stdout.strip().split(" ", 2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps")
def test_a_forkserver_loader_has_the_server_import_torch_once_for_all_workers(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "tokens")
    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(160, dtype="<i4")})  # 16 windows: 5 batches
    torch_in_server, random_in_server, preload = server_imports(LOADER_PROBE, url)
    assert (torch_in_server, random_in_server) == ("True", "True")
    assert preload == "['__main__', 'torch', 'numpy.random', 'rangestream', 'rangestream.loader']"
    # a plain DataLoader leaves the default: its server imports nothing, each worker all
    torch_in_server, random_in_server, preload = server_imports(TORCH_PROBE)
    assert (torch_in_server, random_in_server, preload) == ("False", "False", "['__main__']")
