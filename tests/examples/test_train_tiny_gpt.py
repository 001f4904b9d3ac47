"""The training example, short: a run killed mid-way and resumed has the uninterrupted run's
loss curve, bit for bit (same batches in the same order, model and optimizer restored)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.s3 import S3Location

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"
SHORT = [
    *("--steps", "24", "--tokens", "12000", "--context", "16", "--width", "16"),
    *("--layers", "1", "--heads", "2", "--batch-size", "4", "--checkpoint-every", "4"),
]


def command(location: S3Location, log: Path, checkpoint: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--data", location.url, "--storage-options",
            json.dumps(location.storage_options), "--log", str(log),
            "--checkpoint", str(checkpoint), *SHORT]  # fmt: skip


def losses(log: Path) -> dict[int, float]:
    """Step -> loss; a resumed run's lines replace the killed run's after its checkpoint."""
    out: dict[int, float] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        out[entry["step"]] = entry["loss"]
    return out


def test_a_killed_and_resumed_run_reproduces_the_uninterrupted_loss_curve(
    s3_url: S3Location, tmp_path: Path
) -> None:
    uninterrupted = subprocess.run(
        [*command(s3_url, tmp_path / "a.log", tmp_path / "a.pt"), "--prepare"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    expected = losses(tmp_path / "a.log")
    assert sorted(expected) == list(range(1, 25))
    assert expected[24] < expected[1]  # it learns

    log, checkpoint = tmp_path / "b.log", tmp_path / "b.pt"
    killed = subprocess.Popen(command(s3_url, log, checkpoint), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not log.exists() or len(losses(log)) < 6):
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)  # mid-run, between checkpoints or not
    killed.wait(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    steps_before = len(losses(log))
    assert 6 <= steps_before < 24  # killed after the checkpoint of step 4 at least
    resumed = subprocess.run(command(s3_url, log, checkpoint), capture_output=True, text=True,
                             timeout=300, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step" in resumed.stdout
    assert losses(log) == expected
