"""Datasets: windows of streams, documents, temporal records, as readers with ``reader[i]``."""

from rangestream.dataset.document import DocumentDataset
from rangestream.dataset.stream import StreamDataset
from rangestream.dataset.temporal import TemporalRecords, train_test_split

__all__ = ["DocumentDataset", "StreamDataset", "TemporalRecords", "train_test_split"]
