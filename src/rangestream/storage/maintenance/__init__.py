"""Tools over a stored dataset, not part of reading or writing it.

- ``gc``: find and delete objects no committed version reads (``rangestream gc``);
- ``verify``: check every checksum and index invariant (``rangestream verify``), with
  ``verify_blocks`` (the block scan) and ``verify_report`` (what it found);
- ``summary``: sizes and counts of a dataset (``rangestream inspect``).
"""
