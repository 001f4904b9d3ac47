"""``rangestream.integrations.transformers.Trainer``: a tiny GPT-2 (from a config, nothing
downloaded) trained from a loader over S3, crashed after a checkpoint and resumed: the
resumed run trains on exactly the uninterrupted run's batches after the checkpoint, and the
requests that reach the server (counted at a proxy) are those of a loader that starts at the
checkpoint: no batch before it is read again."""

from __future__ import annotations

import contextlib
import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from support.s3 import S3Location
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError, StateError
from rangestream.integrations.transformers import LOADER_STATE_NAME, Trainer
from rangestream.loader import CausalLMCollate
from testkit import LatencyProxy

VOCAB, LENGTH, BATCH = 48, 8, 4
STEPS, SAVE_EVERY, CRASH_AT = 12, 4, 6
WINDOWS = STEPS * BATCH  # one epoch is the whole run: every read is of a trained batch
RUN_WINDOWS = 2  # the block shuffle's runs: one stored chunk each, one request each
RUN_BYTES = RUN_WINDOWS * LENGTH * 2


class Crash(RuntimeError):
    pass


class CrashAt(TrainerCallback):
    """The training process dies at a step (after the checkpoint before it)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Crash(f"killed at step {self.step}")


def write_tokens(location: S3Location) -> np.ndarray:
    tokens = np.random.default_rng(7).integers(0, VOCAB, WINDOWS * LENGTH, dtype="<u2")
    storage = StreamStorage(location.url, StreamNumpyFormat(np.dtype([("tokens", "<u2")])),
                            storage_options=location.storage_options, chunk_bytes=RUN_BYTES,
                            block_bytes=4 * RUN_BYTES)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    return tokens


def make_loader(location: S3Location, proxy: LatencyProxy, **process: Any) -> StatefulDataLoader:
    """What a user writes: the storage, the model's batch keys, the window and batch size
    (over S3 the default shuffle is the block shuffle; short runs here so that skipping
    would show in the request count)."""
    storage = StreamStorage(
        location.url, storage_options=proxy.merge_storage_options(location.storage_options)
    )
    return StatefulDataLoader.from_storage(
        storage, CausalLMCollate("tokens"), sequence_length=LENGTH, batch_size=BATCH,
        run_windows=RUN_WINDOWS, buffer_runs=2, **process,
    )  # fmt: skip


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=LENGTH,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def train(
    output: Path, loader: StatefulDataLoader, *, resume: bool = False, crash_at: int | None = None
) -> tuple[list[torch.Tensor], dict[int, float]]:
    """The input ids of every training step (seen by the model) and the loss per step."""
    model = tiny_gpt2()
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True
    )
    args = TrainingArguments(output, max_steps=STEPS, save_steps=SAVE_EVERY, logging_steps=1,
                             report_to=[], use_cpu=True, disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_loader=loader, callbacks=[CrashAt(crash_at)])
    with contextlib.suppress(Crash):
        trainer.train(resume_from_checkpoint=resume)
    losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    return seen, losses


def reads(proxy: LatencyProxy) -> list[tuple[str, tuple[int, int] | None]]:
    """The (object, byte range) of every data request since the log started (the
    dataset's shards; its manifest is read on opening, which each run does)."""
    return [(r.path, r.served) for r in proxy.stop_request_log() if "/data/" in r.path]


def rest_of_epoch(loader: StatefulDataLoader, state: dict[str, Any]) -> list[torch.Tensor]:
    """A loader started at ``state`` (and asked its length, as the Trainer asks: one
    metadata read), to the end of the epoch."""
    loader.load_state_dict(state)
    assert len(loader) == STEPS
    return [batch["input_ids"] for batch in loader]


def test_a_crashed_and_resumed_run_trains_on_the_uninterrupted_runs_batches_and_rereads_nothing(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    tokens = write_tokens(s3_url)
    loader = make_loader(s3_url, s3_proxy, num_workers=0)
    s3_proxy.start_request_log()
    uninterrupted, expected_losses = train(tmp_path / "a", loader)
    whole_run = reads(s3_proxy)
    assert len(uninterrupted) == STEPS
    windows = sorted(w.tolist() for b in uninterrupted for w in b)  # each window once
    assert windows == sorted(tokens.reshape(WINDOWS, LENGTH).astype(np.int64).tolist())
    assert all(b.dtype == torch.int64 for b in uninterrupted)

    crashed, _ = train(tmp_path / "b", make_loader(s3_url, s3_proxy, num_workers=0),
                       crash_at=CRASH_AT)  # fmt: skip
    assert len(crashed) == CRASH_AT
    checkpoint = tmp_path / "b" / f"checkpoint-{SAVE_EVERY}"
    state = json.loads((checkpoint / LOADER_STATE_NAME).read_text())
    assert state["consumed_samples"] == SAVE_EVERY * BATCH

    s3_proxy.start_request_log()
    resumed, losses = train(tmp_path / "b", make_loader(s3_url, s3_proxy, num_workers=0),
                            resume=True)  # fmt: skip
    resumed_gets = reads(s3_proxy)
    assert len(resumed) == STEPS - SAVE_EVERY
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[SAVE_EVERY:], resumed, strict=True))
    after = range(SAVE_EVERY + 1, STEPS + 1)
    assert [losses[s] for s in after] == [expected_losses[s] for s in after]  # model, optimizer

    reference = make_loader(s3_url, s3_proxy, num_workers=0)
    s3_proxy.start_request_log()
    rest = rest_of_epoch(reference, state)
    assert all(torch.equal(a, b) for a, b in zip(rest, resumed, strict=True))
    starting_there = reads(s3_proxy)
    assert sorted(resumed_gets) == sorted(starting_there)  # nothing more, nothing again
    assert len(set(starting_there)) < len(set(whole_run))


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_a_resumed_run_with_workers_trains_on_the_uninterrupted_batches(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path, context: str
) -> None:
    write_tokens(s3_url)
    process = {"num_workers": 2, "multiprocessing_context": context}
    # the block shuffle's order depends on the readers (workers) of the epoch: the same
    # num_workers; not on how they start, so the reference runs fork (cheap): the trained
    # runs' batches under ``context`` must equal fork's
    reference_process = {"num_workers": 2, "multiprocessing_context": "fork"}
    uninterrupted = [b["input_ids"] for b in make_loader(s3_url, s3_proxy, **reference_process)]
    assert len(uninterrupted) == STEPS
    crashed, _ = train(tmp_path / "b", make_loader(s3_url, s3_proxy, **process),
                       crash_at=CRASH_AT)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[:CRASH_AT], crashed, strict=True))
    gc.collect()  # the crashed run's workers
    s3_proxy.start_request_log()
    resumed, _ = train(tmp_path / "b", make_loader(s3_url, s3_proxy, **process), resume=True)
    resumed_gets = reads(s3_proxy)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[SAVE_EVERY:], resumed, strict=True))
    state = json.loads(
        (tmp_path / "b" / f"checkpoint-{SAVE_EVERY}" / LOADER_STATE_NAME).read_text()
    )
    reference = make_loader(s3_url, s3_proxy, **reference_process)
    s3_proxy.start_request_log()
    rest_of_epoch(reference, state)
    assert sorted(resumed_gets) == sorted(reads(s3_proxy))


def test_the_stock_trainer_resumes_by_reading_the_skipped_batches_again(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    """What the subclass saves: ``transformers.Trainer`` handed the same loader rebuilds a
    DataLoader over its dataset and reads the skipped batches again (the request count
    above would catch a return of that path)."""

    class Stock(transformers.Trainer):
        def get_train_dataloader(self) -> Any:
            return self.loader

    write_tokens(s3_url)
    args = TrainingArguments(tmp_path / "b", max_steps=STEPS, save_steps=SAVE_EVERY,
                             per_device_train_batch_size=BATCH, report_to=[], use_cpu=True,
                             disable_tqdm=True)  # fmt: skip
    for crash_at, resume in ((CRASH_AT, False), (None, True)):
        trainer = Stock(model=tiny_gpt2(), args=args, callbacks=[CrashAt(crash_at)])
        trainer.loader = make_loader(s3_url, s3_proxy, num_workers=0)
        if resume:
            s3_proxy.start_request_log()
        with contextlib.suppress(Crash):
            trainer.train(resume_from_checkpoint=resume)
    stock_gets = reads(s3_proxy)
    first = make_loader(s3_url, s3_proxy, num_workers=0)
    steps = iter(first)
    for _ in range(SAVE_EVERY):
        next(steps)
    state = first.state_dict()  # where the checkpoint stood
    reference = make_loader(s3_url, s3_proxy, num_workers=0)
    s3_proxy.start_request_log()
    rest_of_epoch(reference, state)
    starting_there = reads(s3_proxy)
    assert len(stock_gets) > len(starting_there)
    assert not set(stock_gets) <= set(starting_there)  # it reads the skipped runs again


def test_a_checkpoint_without_the_loaders_state_is_refused(
    s3_url: S3Location, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    write_tokens(s3_url)
    train(tmp_path / "b", make_loader(s3_url, s3_proxy, num_workers=0), crash_at=CRASH_AT)
    (tmp_path / "b" / f"checkpoint-{SAVE_EVERY}" / LOADER_STATE_NAME).unlink()
    with pytest.raises(StateError, match=LOADER_STATE_NAME):
        train(tmp_path / "b", make_loader(s3_url, s3_proxy, num_workers=0), resume=True)


def test_the_trainer_takes_a_rangestream_loader_only(tmp_path: Path) -> None:
    args = TrainingArguments(tmp_path, max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(LoaderConfigError, match="StatefulDataLoader"):
        Trainer(model=tiny_gpt2(), args=args, train_loader=[{"input_ids": torch.zeros(1, 2)}])
