"""Datasets: windows of streams, documents, as readers with ``reader[i]``."""

from rangestream.dataset.document import DocumentDataset
from rangestream.dataset.stream import StreamDataset

__all__ = ["DocumentDataset", "StreamDataset"]
