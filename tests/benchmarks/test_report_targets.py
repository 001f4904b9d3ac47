"""The issue-30 target table reads each loader row's later-epoch first batches."""

from __future__ import annotations

from benchmarks.measure import WorkloadResult
from benchmarks.report_targets import issue30_targets


def _loader(system: str, workload: str, later: list[float]) -> WorkloadResult:
    return WorkloadResult(system=system, label=system, workload=workload, location="s3",
                          later_epoch_first_batch_s=later)  # fmt: skip


def _epoch_row(rows: dict[str, list[WorkloadResult]]) -> str:
    lines = issue30_targets(rows, {}, lambda _rows: None)
    (row,) = [line for line in lines if "every epoch after the first" in line]
    return row


def test_later_epochs_first_batches_are_reported_per_loader_with_the_bound() -> None:
    rows = {
        "tokens-shuffled": [
            _loader("rangestream-loader-block", "tokens-shuffled", [0.031, 0.044, 0.040]),
            _loader("rangestream-loader", "tokens-shuffled", [0.052]),
        ],
        "tokens-sequential": [_loader("rangestream-loader", "tokens-sequential", [0.020, 0.090])],
    }
    row = _epoch_row(rows)
    assert "block shuffle: at most 44 ms over 3 later epochs (median 40 ms)" in row
    assert "per-window shuffle: at most 52 ms over 1 later epochs" in row
    assert "in order: at most 90 ms over 2 later epochs (median 55 ms)" in row
    assert row.endswith("| yes |")
    rows["tokens-sequential"] = [_loader("rangestream-loader", "tokens-sequential", [0.101])]
    assert _epoch_row(rows).endswith("| **no** |")


def test_no_later_epoch_is_reported_as_not_measured() -> None:
    row = _epoch_row({"tokens-shuffled": [_loader("rangestream-loader-block", "tokens-shuffled",
                                                   [])]})  # fmt: skip
    assert "not measured" in row and row.endswith(f"| {chr(0x2013)} |")
