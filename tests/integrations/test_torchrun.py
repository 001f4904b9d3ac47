"""``torchrun`` (``python -m torch.distributed.run``, gloo on the loopback, CPU) over a loader
built before ``init_process_group``.

Two ranks read K steps and rank 0 saves the loader's state; three ranks load it and play
the rest of the epoch: across the five rank-runs every window of the epoch is read exactly
once. A rank that dies (``os._exit``, ``SIGKILL``) while another waits for it: torchrun
stops the job, and no loader worker of either rank outlives it by more than 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from support.processes import assert_all_end_within, free_port, written

from rangestream import StreamNumpyFormat, StreamStorage

SCRIPT = Path(__file__).with_name("torchrun_train.py")
WINDOWS = 40  # of 8 tokens, batches of 2: 4 steps of two ranks (16), 4 steps of three (24)
STOP_AT = 4


def write_windows(path: Path) -> str:
    """Tokens 0, 1, 2, ... in two records: window ``w`` starts with token ``8 * w``."""
    storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    tokens = np.arange(WINDOWS * 8, dtype="<u2")
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens[:100]})
        writer.append(1, {"tokens": tokens[100:]})
    return str(path)


def torchrun(ranks: int, data: str, out: Path, plan: str) -> tuple[int, str]:
    """Run the script under torchrun; its return code and output (to a file, not a pipe,
    so the code comes when torchrun ends, whatever outlives it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(SCRIPT), data, str(out), plan]  # fmt: skip
    log = out / f"torchrun.{plan.replace(':', '_')}.log"
    with open(log, "w") as output:
        code = subprocess.call(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                               timeout=240)  # fmt: skip
    return code, log.read_text()[-4000:]


def read(out: Path, name: str, rank: int) -> list[list[int]]:
    lines = (out / f"{name}.rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line)["windows"] for line in lines]


def test_two_ranks_stop_and_three_resume_reading_each_window_exactly_once(
    tmp_path: Path,
) -> None:
    data = write_windows(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    code, output = torchrun(2, data, out, f"stop:{STOP_AT}")
    assert code == 0, output
    first = [read(out, "stop", rank) for rank in range(2)]
    assert [len(batches) for batches in first] == [STOP_AT, STOP_AT]
    code, output = torchrun(3, data, out, "resume")
    assert code == 0, output
    second = [read(out, "resume", rank) for rank in range(3)]
    assert [len(batches) for batches in second] == [4, 4, 4]
    seen = Counter(w for run in first + second for batch in run for w in batch)
    assert sorted(seen) == list(range(WINDOWS)), "a window was never read"
    assert max(seen.values()) == 1, f"read twice: {[w for w, n in seen.items() if n > 1]}"
    # rank 0's state records the rank and world size resolved once the group existed
    state = torch.load(out / "state.pt")
    assert (state["rank"], state["world_size"]) == (0, 2)
    assert state["consumed_samples"] == STOP_AT * 2 * 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_dead_rank_leaves_no_loader_worker_of_any_rank(tmp_path: Path, how: str) -> None:
    data = write_windows(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    code, output = torchrun(2, data, out, f"die:{how}")
    assert code != 0, output
    reports = [json.loads(written(out / f"workers.rank{rank}.json")) for rank in range(2)]
    workers = [pid for report in reports for pid in report["workers"]]
    assert len(workers) == 4, reports  # two per rank
    assert_all_end_within(workers, 10, f"their torchrun ranks ({how})")
