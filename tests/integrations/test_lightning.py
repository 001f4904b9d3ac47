"""Lightning DDP on CPU (gloo, two ranks) with the loader built in ``LightningDataModule.__init__``.

The run is ``lightning_train.py`` (the user-side code a Lightning user writes), started as a
script as a user starts it: Lightning's ``ddp`` launcher then re-runs it once per further
rank, and ``ddp_fork`` forks the ranks from the process that built the loader. Checked: the
two ranks train on disjoint windows that cover the epoch exactly (the loader was made
before the process group existed), int64 tokens, a checkpoint taken at step K and resumed
with ``ckpt_path=`` gives exactly the batches of the uninterrupted run after K (Lightning
saves and loads the loader's ``state_dict`` itself: no glue), and a rank that dies
(``os._exit``, ``SIGKILL``) leaves no loader worker behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import assert_all_end_within, written

from rangestream import StreamNumpyFormat, StreamStorage

SCRIPT = Path(__file__).with_name("lightning_train.py")
WINDOWS = 96  # of 8 tokens: 12 steps of 2 ranks x 4
STOP_AT = 5


def write_windows(path: Path) -> str:
    """Tokens 0, 1, 2, ... in two records: window ``w`` starts with token ``8 * w``."""
    storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    tokens = np.arange(WINDOWS * 8, dtype="<u2")
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens[:400]})
        writer.append(1, {"tokens": tokens[400:]})
    return str(path)


def run_script(data: str, out: Path, strategy: str, plan: str) -> tuple[int, str]:
    """Run the script; its return code and output. The output goes to a file, not a pipe:
    waiting on a pipe would wait for every process holding it (a worker that outlived its
    rank too), and the return code comes when rank 0 ends."""
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "MASTER_PORT"):
        env.pop(name, None)
    log = out.with_suffix(".log")
    with open(log, "w") as output:
        code = subprocess.call(
            [sys.executable, str(SCRIPT), data, str(out), strategy, plan],
            env=env, stdout=output, stderr=subprocess.STDOUT, timeout=240,
        )  # fmt: skip
    return code, log.read_text()[-4000:]


def steps(out: Path, run: str, rank: int) -> list[dict[str, Any]]:
    lines = Path(out, f"{run}.rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def windows(out: Path, run: str, rank: int) -> list[list[int]]:
    return [step["windows"] for step in steps(out, run, rank)]


def assert_disjoint_and_whole(out: Path, run: str) -> None:
    per_rank = [[w for batch in windows(out, run, rank) for w in batch] for rank in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1]) == WINDOWS // 2
    assert not set(per_rank[0]) & set(per_rank[1]), "two ranks trained on the same windows"
    assert sorted(per_rank[0] + per_rank[1]) == list(range(WINDOWS))


def test_lightning_ddp_loader_built_in_init_shards_and_resumes_exactly(tmp_path: Path) -> None:
    data = write_windows(tmp_path / "data")
    out = tmp_path / "out"
    code, output = run_script(data, out, "ddp", f"resume:{STOP_AT}")
    assert code == 0, output
    assert_disjoint_and_whole(out, "full")
    assert {step["dtype"] for step in steps(out, "full", 0)} == {"torch.int64"}
    for rank in (0, 1):
        full = windows(out, "full", rank)
        assert windows(out, "stop", rank) == full[:STOP_AT]
        resumed = steps(out, "resume", rank)
        assert [step["step"] for step in resumed] == list(range(STOP_AT, WINDOWS // 8))
        assert [step["windows"] for step in resumed] == full[STOP_AT:]


def test_lightning_ddp_fork_loader_built_before_the_ranks_shards(tmp_path: Path) -> None:
    data = write_windows(tmp_path / "data")
    out = tmp_path / "out"
    code, output = run_script(data, out, "ddp_fork", "once")
    assert code == 0, output
    assert_disjoint_and_whole(out, "once")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_lightning_ddp_ranks_that_die_leave_no_loader_worker(tmp_path: Path, how: str) -> None:
    data = write_windows(tmp_path / "data")
    out = tmp_path / "out"
    code, output = run_script(data, out, "ddp", f"die:{how}")
    assert code != 0, output
    reports = [json.loads(written(out / f"workers.rank{rank}.json")) for rank in (0, 1)]
    workers = [pid for report in reports for pid in report["workers"]]
    assert len(workers) == 4  # two per rank
    assert_all_end_within(workers, 10, f"their Lightning ddp rank ({how})")
