from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from rangestream.errors import CollateError
from rangestream.loader import Pad, PadCollate, length_mask, pad_stack, stack_collate


def test_stack_collate_stacks_equal_shape_fields_into_tensors() -> None:
    samples = [{"tokens": np.arange(4) + 10 * i, "mask": np.ones(4, bool)} for i in range(3)]
    batch = stack_collate(samples)
    assert isinstance(batch["tokens"], torch.Tensor)
    assert batch["tokens"].tolist() == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]
    assert batch["mask"].dtype == torch.bool and batch["mask"].shape == (3, 4)


def test_stack_collate_splits_structured_arrays_into_one_tensor_per_field() -> None:
    dtype = np.dtype([("token", "<i4"), ("loss_mask", "u1")])
    samples = [np.array([(1, 0), (2, 1)], dtype=dtype), np.array([(3, 1), (4, 1)], dtype=dtype)]
    batch = stack_collate(samples)
    assert set(batch) == {"token", "loss_mask"}
    assert batch["token"].tolist() == [[1, 2], [3, 4]]
    assert batch["loss_mask"].tolist() == [[0, 1], [1, 1]]


def test_stack_collate_keeps_lists_per_sample() -> None:
    annotations = [[{"concepts": np.arange(2)}], [{"concepts": np.arange(3)}, {"concepts": None}]]
    samples = [
        {"tokens": np.arange(4), "annotation_index": np.zeros(4, np.int64), "annotations": a}
        for a in annotations
    ]
    batch = stack_collate(samples)
    assert batch["annotations"] is not annotations
    assert batch["annotations"] == annotations
    assert batch["annotation_index"].shape == (2, 4)


def test_stack_collate_turns_scalars_into_a_tensor() -> None:
    batch = stack_collate(
        [{"position": np.int64(4), "weight": 0.5}, {"position": 7, "weight": 1.0}]
    )
    assert batch["position"].tolist() == [4, 7]
    assert batch["weight"].tolist() == [0.5, 1.0]


def test_stack_collate_collates_tuples_and_named_tuples_elementwise() -> None:
    class Pair(NamedTuple):
        x: np.ndarray
        name: str

    batch = stack_collate([Pair(np.zeros(2), "a"), Pair(np.ones(2), "b")])
    assert isinstance(batch, Pair)
    assert batch.x.tolist() == [[0, 0], [1, 1]]
    assert batch.name == ["a", "b"]


def test_stack_collate_names_the_field_whose_shapes_differ() -> None:
    samples = [{"meta": {"tokens": np.arange(3)}}, {"meta": {"tokens": np.arange(5)}}]
    with pytest.raises(CollateError, match=r"'meta\.tokens'.*\(3,\), \(5,\)"):
        stack_collate(samples)


def test_stack_collate_refuses_samples_with_different_keys() -> None:
    with pytest.raises(CollateError, match="different keys"):
        stack_collate([{"a": np.zeros(1)}, {"b": np.zeros(1)}])


def test_pad_stack_pads_to_the_batch_maximum_along_axis_zero() -> None:
    padded, lengths = pad_stack([np.array([1, 2]), np.array([3]), np.array([4, 5, 6])], value=-1)
    assert padded.tolist() == [[1, 2, -1], [3, -1, -1], [4, 5, 6]]
    assert lengths.tolist() == [2, 1, 3]


def test_pad_stack_pads_along_a_chosen_axis() -> None:
    first = np.ones((2, 1), dtype=np.float32)
    second = np.full((2, 3), 2, dtype=np.float32)
    padded, lengths = pad_stack([first, second], axis=-1, value=0.5)
    assert padded.shape == (2, 2, 3)
    expected = np.stack([np.pad(first, ((0, 0), (0, 2)), constant_values=0.5), second])
    assert np.array_equal(padded.numpy(), expected)
    assert lengths.tolist() == [1, 3]


def test_pad_stack_refuses_arrays_that_differ_on_another_axis() -> None:
    with pytest.raises(CollateError, match="pads only axis 0"):
        pad_stack([np.zeros((2, 3)), np.zeros((2, 4))])


def test_pad_stack_refuses_a_pad_value_the_dtype_cannot_hold() -> None:
    with pytest.raises(CollateError, match="does not fit dtype uint8"):
        pad_stack([np.zeros(2, np.uint8), np.zeros(1, np.uint8)], value=-1)


def test_length_mask_marks_real_elements() -> None:
    mask = length_mask(torch.tensor([2, 0, 3]))
    assert mask.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert length_mask(torch.tensor([1]), max_length=3).tolist() == [[True, False, False]]


def test_pad_collate_pads_named_fields_and_reports_lengths() -> None:
    samples = [{"tokens": np.arange(n), "label": np.int64(n)} for n in (2, 4)]
    batch = PadCollate({"tokens": Pad(value=9)})(samples)
    assert list(batch) == ["tokens", "tokens_lengths", "label"]
    assert batch["tokens"].tolist() == [[0, 1, 9, 9], [0, 1, 2, 3]]
    assert batch["tokens_lengths"].tolist() == [2, 4]
    assert batch["label"].tolist() == [2, 4]


def test_pad_collate_reports_a_mask_when_asked() -> None:
    samples = [{"tokens": np.arange(n)} for n in (3, 1)]
    batch = PadCollate({"tokens": Pad(report="mask")})(samples)
    assert batch["tokens_mask"].tolist() == [[True, True, True], [True, False, False]]


def test_pad_collate_pads_bare_arrays_with_a_single_pad() -> None:
    padded, lengths = PadCollate(Pad(value=-1))([np.arange(1), np.arange(2)])
    assert padded.tolist() == [[0, -1], [0, 1]]
    assert lengths.tolist() == [1, 2]
    only = PadCollate(Pad(report=None))([np.arange(1), np.arange(2)])
    assert isinstance(only, torch.Tensor) and only.shape == (2, 2)


def test_pad_collate_never_overwrites_a_sample_field() -> None:
    samples = [{"tokens": np.arange(2), "tokens_lengths": 1}]
    batch = PadCollate({"tokens": Pad()})(samples)
    assert batch["tokens_lengths"].tolist() == [1]  # the record's own field
    assert batch["tokens_pad_lengths"].tolist() == [2]
    with pytest.raises(CollateError, match="overwrite"):
        PadCollate({"tokens": Pad(report_key="tokens_lengths")})(samples)


def test_pad_collate_keeps_the_dpo_records_own_masks() -> None:
    records = [{"chosen": np.arange(n), "chosen_mask": np.ones(n, np.uint8) * 7} for n in (2, 3)]
    batch = PadCollate({"chosen": Pad(report="mask"), "chosen_mask": Pad(report=None)})(records)
    assert batch["chosen_mask"].tolist() == [[7, 7, 0], [7, 7, 7]]
    assert batch["chosen_pad_mask"].tolist() == [[True, True, False], [True, True, True]]


def test_pad_collate_names_missing_fields() -> None:
    with pytest.raises(CollateError, match=r"\['text'\]"):
        PadCollate({"text": Pad()})([{"tokens": np.arange(2)}])


def test_a_single_pad_on_dict_samples_says_to_name_the_fields_to_pad() -> None:
    samples = [{"tokens": np.arange(2), "label": 1}, {"tokens": np.arange(3), "label": 0}]
    with pytest.raises(CollateError) as caught:
        PadCollate(Pad())(samples)
    message = str(caught.value)
    assert "ndim" not in message
    # the field whose length varies is the one to name
    assert "['label', 'tokens']" in message and "PadCollate({'tokens': Pad()})" in message


def test_workers_collate_large_batches_straight_into_shared_memory_and_small_ones_not() -> None:
    """Large batches go to the main process through shared memory, so they are stacked
    there; small ones go by value (``loader.transport``) and stay in ordinary memory."""

    def collate_and_report(samples: list[Any]) -> Any:
        batch = stack_collate(samples)
        return batch, batch.is_shared()

    large = 128 * 1024  # int64 elements: 1 MiB per sample
    for size, shared in [(4, False), (large, True)]:
        loader = torch.utils.data.DataLoader(
            [np.arange(size) + i for i in range(6)], batch_size=3, num_workers=1,
            collate_fn=collate_and_report,
        )  # fmt: skip
        results = list(loader)
        assert [in_worker for _, in_worker in results] == [shared, shared]
        np.testing.assert_array_equal(
            results[1][0].numpy(), np.arange(size) + np.arange(3, 6)[:, None]
        )
    assert not stack_collate([np.arange(2), np.arange(2)]).is_shared()  # not in a worker


@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64", "float32", "bool", ">i4"])
def test_stack_collate_stacks_alike_arrays_as_numpy_stacks_them(dtype: str) -> None:
    """Arrays of one shape and dtype (token windows) take the short path; anything else the
    general one (a non-native byte order among them): the same values, dtype and shape
    either way."""
    base = (np.arange(24) % 7).astype(dtype).reshape(4, 6)
    rows = [base[i, ::2] for i in range(4)]  # strided views
    batch = stack_collate(rows)
    expected = np.stack(rows)
    assert batch.dtype == torch.from_numpy(expected).dtype
    assert tuple(batch.shape) == expected.shape and batch.is_contiguous()
    np.testing.assert_array_equal(batch.numpy(), expected)
    base[0, 0] = 1 - base[0, 0]  # the batch owns its memory
    np.testing.assert_array_equal(batch.numpy(), expected)
    if not np.dtype(dtype).isnative:
        return
    mixed = stack_collate([rows[0], torch.from_numpy(rows[1].copy())])  # not all arrays
    np.testing.assert_array_equal(mixed.numpy(), np.stack(rows[:2]))
    widened = stack_collate([rows[0].astype(np.int64), rows[1]])  # dtypes differ: promoted
    assert widened.dtype == torch.from_numpy(np.stack([rows[0].astype(np.int64), rows[1]])).dtype


def test_stack_collate_takes_the_first_samples_key_order_whatever_the_others() -> None:
    batch = stack_collate(
        [{"a": np.arange(2), "b": np.ones(2)}, {"b": np.zeros(2), "a": np.arange(2)}]
    )
    assert list(batch) == ["a", "b"]
    np.testing.assert_array_equal(batch["b"].numpy(), [[1.0, 1.0], [0.0, 0.0]])
