"""The storage lifecycle every kind shares, and the contract it holds a kind to.

- ``kind``: ``StorageKind``, what the lifecycle asks of a kind, and ``ShardEncoder``;
- ``base``: ``Storage``, the picklable description every kind subclasses;
- ``options``: read and layout options, validated once;
- ``opening``: the committed version opened once per process (``OpenedStorage``);
- ``readers``: the sync and async readers, two faces of one opened version;
- ``writing``: write sessions and the writers that append records to shards;
- ``block_uploads``: a writer's block buffering, uploads and spilling;
- ``parts``: the part manifest each writer leaves;
- ``commit``: gathering the parts and publishing the root; ``appending``: what an
  append may add to a committed version;
- ``root``: reading the root document within its cap and publishing it conditionally;
- ``store_errors``: the library errors of the write path;
- ``zarr_view``: the committed version as a zarr-python group.
"""
