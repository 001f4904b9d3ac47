"""botocore's shared configuration is resolved once per process tree, not once per worker.

Each forked DataLoader worker resolved it again through a botocore session (10-90 ms of
its start); the resolved values are plain data, so a fork keeps the parent's.
"""

from __future__ import annotations

import multiprocessing

import pytest

from rangestream.io import s3_options


def _resolved_in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    calls: list[int] = []
    real = s3_options._resolve_botocore_configuration

    def counting() -> s3_options.BotocoreConfiguration | None:
        calls.append(1)
        return real()

    s3_options._resolve_botocore_configuration = counting  # type: ignore[assignment]
    queue.put((s3_options.botocore_configuration(), len(calls)))


def test_a_forked_child_keeps_the_parents_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    parent = s3_options.botocore_configuration()
    assert parent is not None and parent.region == "eu-west-3"
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_resolved_in_child, args=(queue,))
    child.start()
    resolved, calls = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert (resolved, calls) == (parent, 0)


def test_a_changed_environment_is_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    assert s3_options.botocore_configuration().region == "eu-west-3"  # type: ignore[union-attr]
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-2")
    assert s3_options.botocore_configuration().region == "ap-south-2"  # type: ignore[union-attr]
