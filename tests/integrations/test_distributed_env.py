"""Rank and world size are resolved when iteration starts, from the process group then.

A loader built before ``init_process_group`` (in a ``LightningDataModule.__init__``, in a
parent that forks or pickles it to its ranks) shards by the real ranks once the group
exists, with DataLoader workers started by ``fork``, ``spawn`` or ``forkserver`` and under
a plain ``torch.utils.data.DataLoader``; its state records the resolved values. Where the
launcher's environment says distributed but no group exists when iteration starts, the
loader refuses, naming the variables and ``init_process_group``; explicit ``rank=`` and
``world_size=`` win over both.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed
import torch.multiprocessing
import torch.utils.data
from support.processes import free_port

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError
from rangestream.loader import launcher_environment

WINDOW = 4
WINDOWS = 48  # batches of 3: 8 steps of two ranks
LAUNCHER = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


@pytest.fixture
def storage(tmp_path: Path) -> StreamStorage:
    """Tokens 0, 1, 2, ...: window ``w`` starts with token ``WINDOW * w``."""
    storage = StreamStorage(tmp_path / "s", StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(WINDOWS * WINDOW, dtype="<u2")})
    return storage


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def windows(batches: Any) -> list[int]:
    return [w for batch in batches for w in (batch["tokens"][:, 0] // WINDOW).tolist()]


@pytest.mark.parametrize(
    "environment",
    [{"WORLD_SIZE": "2"}, {"RANK": "1"}, {"LOCAL_RANK": "1"},
     {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}],
)  # fmt: skip
def test_a_launcher_environment_without_a_process_group_is_refused_when_iteration_starts(
    storage: StreamStorage, no_launcher: pytest.MonkeyPatch, environment: dict[str, str]
) -> None:
    for name, value in environment.items():
        no_launcher.setenv(name, value)
    loader = StatefulDataLoader.from_storage(storage, sequence_length=WINDOW, num_workers=0)
    for start in (lambda: next(iter(loader)), lambda: len(loader), loader.state_dict,
                  lambda: next(iter(loader.dataset))):  # fmt: skip
        with pytest.raises(LoaderConfigError) as refused:
            start()
        message = str(refused.value)
        assert "init_process_group" in message
        for name, value in environment.items():
            assert f"{name}={value}" in message


def test_one_rank_says_nothing_and_explicit_values_win_over_the_environment(
    storage: StreamStorage, no_launcher: pytest.MonkeyPatch
) -> None:
    no_launcher.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1
    no_launcher.setenv("RANK", "0")
    assert launcher_environment() == {}
    single = StatefulDataLoader.from_storage(storage, sequence_length=WINDOW, batch_size=3,
                                             num_workers=0, shuffle=False)  # fmt: skip
    assert windows(single) == list(range(WINDOWS))
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("RANK", "1")
    explicit = StatefulDataLoader.from_storage(storage, sequence_length=WINDOW, batch_size=3,
                                               num_workers=0, shuffle=False, rank=1,
                                               world_size=2)  # fmt: skip
    assert windows(explicit) == [w for step in range(8) for w in range(6 * step + 3, 6 * step + 6)]
    assert (explicit.state_dict()["rank"], explicit.state_dict()["world_size"]) == (1, 2)


def test_a_process_group_made_after_the_loader_is_read_when_iteration_starts(
    storage: StreamStorage, no_launcher: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loader = StatefulDataLoader.from_storage(storage, sequence_length=WINDOW, batch_size=3,
                                             num_workers=0)  # fmt: skip
    assert len(loader) == 16  # no group yet, no launcher: one rank
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                         rank=0, world_size=1)  # fmt: skip
    try:
        no_launcher.setenv("WORLD_SIZE", "2")  # the group, once it exists, is what counts
        assert sorted(windows(loader)) == list(range(WINDOWS))
        assert loader.state_dict()["world_size"] == 1
    finally:
        torch.distributed.destroy_process_group()


# -- real ranks --------------------------------------------------------------------------


def run_rank(rank: int, pickled: bytes, method: str, port: int, out: str) -> None:
    """One rank of two: the loader arrives built (pickled, as ddp_spawn sends it); the group
    is made here; then one epoch through the loader and one through a plain DataLoader."""
    loader: StatefulDataLoader = pickle.loads(pickled)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=2)  # fmt: skip
    try:
        ours = windows(loader)
        state = loader.state_dict()
        plain = torch.utils.data.DataLoader(loader.dataset, batch_size=None, num_workers=1,
                                            multiprocessing_context=method)  # fmt: skip
        foreign = windows(plain)
        report = {"ours": ours, "foreign": foreign, "length": len(loader),
                  "state": [state["rank"], state["world_size"]],
                  "watched": loader.worker_init_fn.main_pid == os.getpid()}  # fmt: skip
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_loader_built_before_the_ranks_shards_by_them_with_any_worker_start(
    storage: StreamStorage, no_launcher: pytest.MonkeyPatch, tmp_path: Path, method: str
) -> None:
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW, batch_size=3, num_workers=1, shuffle_seed=3,
        multiprocessing_context=method,
    )  # fmt: skip
    no_launcher.setenv("GLOO_SOCKET_IFNAME", "lo")
    # A forkserver that an earlier test started in this pytest process is not the ranks'
    # own: a rank forked from here inherits its pid, cannot wait on it (not its child) and
    # fails to start a worker. A training script has none before its ranks; stop it.
    multiprocessing.forkserver._forkserver._stop()
    torch.multiprocessing.start_processes(
        run_rank, args=(pickle.dumps(loader), method, free_port(), str(tmp_path)), nprocs=2,
        join=True, start_method="fork",
    )  # fmt: skip
    reports = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2)]
    for kind in ("ours", "foreign"):
        first, second = (report[kind] for report in reports)
        assert len(first) == len(second) == WINDOWS // 2, kind
        assert not set(first) & set(second), f"both ranks read the same windows ({kind})"
        assert sorted(first + second) == list(range(WINDOWS)), kind
    assert [report["state"] for report in reports] == [[0, 2], [1, 2]]
    assert [report["length"] for report in reports] == [8, 8]
    assert all(report["watched"] for report in reports)  # workers watch their rank
