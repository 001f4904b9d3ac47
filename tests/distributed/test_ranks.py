"""Real ranks: ``torch.distributed`` (gloo, CPU) processes, each with two DataLoader workers.

Each test spawns a two-rank job that plays a whole epoch, then stops the next epoch at step
``k`` and saves the loader state; then a three-rank job resumes from that state. Checked for
one storage (the block shuffle over S3, the per-window shuffle on local disk) and for a
mixture of two: every sample of an epoch is loaded exactly once across ranks (padding aside,
which is counted), and the resumed three ranks load exactly what the two left.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import torch.multiprocessing
from support.s3 import Location

from .ranks import OFFSET, Job, job_json, run_rank, write_tokens

WINDOWS_A, WINDOWS_B = 90, 60
STOP_AT = 4


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spawn(world_size: int, job: Job) -> list[dict[str, Any]]:
    """Start ``world_size`` rank processes and wait for them. They are forked (a spawned rank
    re-imports torch: seconds per rank on these machines); each then joins the process group
    and starts its own DataLoader workers, as under torchrun."""
    torch.multiprocessing.start_processes(
        run_rank, args=(world_size, job_json(job)), nprocs=world_size, join=True,
        start_method="fork",
    )  # fmt: skip
    return [json.loads(Path(job.out_dir, f"rank{r}.json").read_text()) for r in range(world_size)]


def global_order(reports: list[dict[str, Any]], name: str, epoch: int) -> list[int]:
    """Samples of one epoch over all ranks, step by step, rank by rank."""
    per_rank = [report[name]["epochs"][epoch] for report in reports]
    assert len({len(batches) for batches in per_rank}) == 1  # every rank steps together
    return [s for step in zip(*per_rank, strict=True) for batch in step for s in batch]


def test_ranks_load_each_sample_once_and_three_ranks_resume_what_two_left(
    location: Location, tmp_path: Path
) -> None:
    url_a, url_b = location.child("a"), location.child("b")
    write_tokens(url_a, location.storage_options, 0, WINDOWS_A)
    write_tokens(url_b, location.storage_options, OFFSET, WINDOWS_B)
    everything = {
        "single": list(range(WINDOWS_A)),
        "mixture": list(range(WINDOWS_A)) + [OFFSET + i for i in range(WINDOWS_B)],
    }
    first_dir, second_dir = tmp_path / "two", tmp_path / "three"
    first_dir.mkdir()
    second_dir.mkdir()
    two = spawn(2, Job(url_a, url_b, location.storage_options, str(first_dir), free_port(),
                       stop_at=STOP_AT))  # fmt: skip
    assert [(r["single"]["rank"], r["single"]["world_size"]) for r in two] == [(0, 2), (1, 2)]
    states = {name: two[0][name]["state"] for name in everything}
    three = spawn(3, Job(url_a, url_b, location.storage_options, str(second_dir), free_port(),
                         resume=states))  # fmt: skip
    for name, samples in everything.items():
        # epoch 0 over two ranks: every sample once; batches of 3 on 2 ranks pad the last
        # global batch with at most 5 samples from the start of the epoch's order
        epoch = global_order(two, name, 0)
        counts = Counter(epoch)
        assert set(counts) == set(samples)
        assert len(epoch) - len(samples) == -len(samples) % 6
        # epoch 1: k steps on two ranks, the rest on three
        head = global_order(two, name, 1)
        rest = global_order(three, name, 0)
        assert len(head) == STOP_AT * 6
        resumed = Counter(head + rest)
        assert set(resumed) == set(samples)  # nothing lost ...
        padding = len(head) + len(rest) - len(samples)
        assert 0 <= padding < 9  # ... and only the last global batch of 9 padded
        assert sum(count - 1 for count in resumed.values()) == padding
