"""Presets: stored dtypes from the vocabulary, outcomes per row, refusals up front."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rangestream.ingest.inputs import Row
from rangestream.ingest.preset import Fields, Limits, token_dtype
from rangestream.ingest.presets import get_preset
from rangestream.ingest.tokenizers import ByteTokenizer


@pytest.mark.parametrize(
    ("vocab", "dtype"), [(2, "u1"), (256, "u1"), (257, "<u2"), (65536, "<u2"), (65537, "<u4")]
)
def test_the_smallest_unsigned_dtype_holding_the_vocabulary_is_chosen(
    vocab: int, dtype: str
) -> None:
    assert token_dtype(vocab) == np.dtype(dtype)


def test_sft_positions_fit_max_len_and_tokens_fit_the_vocabulary() -> None:
    preset = get_preset("sft", ByteTokenizer(), Fields(), Limits(300, "split"))
    dtype = preset.storage_format().stream_dtype
    assert dtype == np.dtype([("sequence", "<u2"), ("loss_mask", "u1"), ("position_ids", "<u2")])
    unbounded = get_preset("sft", ByteTokenizer(), Fields(), Limits()).storage_format()
    assert unbounded.stream_dtype["position_ids"] == np.dtype("<u4")


@pytest.mark.parametrize("name", ["dpo", "grpo"])
def test_record_presets_cannot_split(name: str) -> None:
    with pytest.raises(ValueError, match="cannot split"):
        get_preset(name, ByteTokenizer(), Fields(), Limits(10, "split"))


@pytest.mark.parametrize("limits", [(1, "error"), (10, "drop")])
def test_bad_limits_are_refused(limits: Any) -> None:
    with pytest.raises(ValueError):
        Limits(*limits)


def test_each_row_gives_its_outcome_in_order_with_counts() -> None:
    preset = get_preset("seq", ByteTokenizer(), Fields(text="body"), Limits(4, "split"))
    rows = [
        Row("f:1", {"body": "abcdef"}),
        Row("f:2", {"text": "wrong field"}),
        Row("f:3", error="malformed JSON: x"),
        Row("f:4", {"body": "z"}),
    ]
    outcomes = preset.convert(rows)
    assert [o.row.where for o in outcomes] == ["f:1", "f:2", "f:3", "f:4"]
    assert [r["sequence"].tolist() for r in outcomes[0].records] == [
        [97, 98, 99, 100],
        [101, 102, 256],
    ]
    assert (outcomes[0].tokens, outcomes[0].loss_tokens) == (7, 7)
    assert outcomes[1].error == "f:2: missing field 'body'"
    assert outcomes[2].error == "f:3: malformed JSON: x"
    assert outcomes[3].records[0]["sequence"].tolist() == [122, 256]


def test_grpo_rewards_must_match_the_responses() -> None:
    preset = get_preset("grpo", ByteTokenizer(), Fields(), Limits())
    (outcome,) = preset.convert(
        [Row("f:1", {"prompt": "p", "responses": ["a", "b"], "rewards": [1.0]})]
    )
    assert outcome.error == "f:1: 'rewards' must be 2 numbers, one per response"


def test_grpo_truncates_responses_to_the_room_the_prompt_leaves() -> None:
    preset = get_preset("grpo", ByteTokenizer(), Fields(), Limits(5, "truncate"))
    (outcome,) = preset.convert(
        [Row("f:1", {"prompt": "pp", "responses": ["abcdef", "x"], "rewards": [1, 0]})]
    )
    (record,) = outcome.records
    assert record["prompts"].tolist() == [112, 112]
    assert [r.tolist() for r in record["responses"]] == [[97, 98, 99], [120, 256]]
