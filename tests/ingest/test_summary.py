"""Summary: the end-of-run figures, computed from the split results."""

from __future__ import annotations

from rangestream.ingest.summary import SplitResult, Summary


def test_the_summary_adds_splits_and_states_the_loss_fraction() -> None:
    summary = Summary(
        "s3://b/ds", splits=3, splits_skipped=1, shards=3, nbytes=2_500_000, seconds=2.0
    )
    summary.add(SplitResult(0, rows=10, records=9, tokens=300, loss_tokens=75, rejected=1))
    summary.add(SplitResult(2, rows=5, records=5, tokens=100, loss_tokens=25))
    assert (summary.rows, summary.records, summary.tokens, summary.rejected) == (15, 14, 400, 1)
    assert summary.loss_fraction == 0.25 and summary.tokens_per_second == 200
    summary.rejects_url = "s3://b/ds/rejects.jsonl"
    text = str(summary)
    assert "records   14 from 15 input rows" in text
    assert "tokens    400 (25.0% with loss mask 1), 200 tokens/s" in text
    assert "rejected  1 rows, listed in s3://b/ds/rejects.jsonl" in text
    assert "shards    3 from 3 input splits (1 already written, resumed)" in text
    assert "bytes     2.5 MB of data" in text
