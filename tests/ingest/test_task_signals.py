"""A conversion's pool workers end with it: ``kill -9`` of the parent, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def big_input(tmp_path: Path) -> Path:
    """About 48 MB of JSONL: a minute of work for two workers with a BPE tokenizer."""
    line = ('{"text": "' + "rangestream " * 400 + '"}\n').encode()
    path = tmp_path / "big.jsonl"
    with path.open("wb") as handle:
        handle.write(line * (48_000_000 // len(line)))
    return path


def start_convert(tmp_path: Path, tokenizer: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from rangestream.cli.main import main; raise SystemExit(main())",
         "convert", str(big_input(tmp_path)), "--to", str(tmp_path / "out"), "--preset", "seq",
         "--tokenizer", str(tokenizer), "--workers", "2", "--no-progress",
         "--split-bytes", "4000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def children(pid: int) -> set[int]:
    found: set[int] = set()
    with_tasks = Path(f"/proc/{pid}/task")
    if not with_tasks.exists():
        return found
    for task in with_tasks.iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for_workers(parent: subprocess.Popen[str], count: int) -> set[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert parent.poll() is None, parent.communicate()
        # the pool's workers, and the resource tracker some start methods add
        workers = children(parent.pid)
        if len(workers) >= count and (Path(parent.args[6]) / "data").exists():
            return workers
        time.sleep(0.1)
    raise AssertionError("the workers never started")


def test_the_workers_die_within_ten_seconds_of_a_kill_9_of_the_parent(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    parent = start_convert(tmp_path, tokenizer_json)
    workers = wait_for_workers(parent, 2)
    time.sleep(0.5)  # the workers are converting now
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    killed = time.monotonic()
    while any(alive(w) for w in workers) and time.monotonic() - killed < 10:
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "workers outlived their parent by 10 s"


def test_ctrl_c_stops_within_two_seconds_saying_how_to_resume(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    parent = start_convert(tmp_path, tokenizer_json)
    workers = wait_for_workers(parent, 2)
    time.sleep(0.5)
    began = time.monotonic()
    os.killpg(parent.pid, signal.SIGINT)  # what a terminal sends to its foreground group
    _out, err = parent.communicate(timeout=30)
    took = time.monotonic() - began
    assert parent.returncode == 130, err
    assert took < 2.0, f"took {took:.1f} s"
    assert "interrupted" in err and "--resume" in err and "splits are written" in err, err
    assert "resume=True" not in err
    assert not [w for w in workers if alive(w)]
