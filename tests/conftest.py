"""Suite-wide pytest configuration.

Fixtures live in ``tests/support/`` modules, registered here as plugins, so this file stays a
short index. ``support`` must be importable: pytest's default (prepend) import mode puts
``tests/`` on sys.path because it has no ``__init__.py``; ``pythonpath = [".", "tests"]`` in
the pytest configuration makes that explicit and also covers ``--import-mode=importlib``. The
repository root on that path is what makes the test kit (``testkit/``: the SeaweedFS server
and the latency proxy the S3 fixtures are built on) importable: it is not installed.

S3 fixtures (see ``support/s3.py``): ``seaweedfs_server``, ``s3_server``, ``s3_bucket``,
``s3_url``, ``location`` (parametrised "local"/"s3") and ``s3_proxy``; the S3 server matrix
(see ``support/s3_matrix.py``): tests marked ``s3_core`` also run on moto and rclone. Dask (see
``support/dask.py``): ``dask_client``, a LocalCluster of worker processes. Tokenizers (see
``support/tokenizers.py``): ``tokenizer_dir``, ``tokenizer_json``, ``rust_tokenizer``. Mapped reads
(see ``support/copies.py``): ``copies`` (parametrised "compiled"/"numpy"). GCS and Azure
emulators (see ``support/cloud.py``): ``gcs_emulator``, ``azurite``, ``gcs_location``,
``azure_location``, ``cloud_location`` (parametrised "gcs"/"azure") and ``cloud_proxy``.
"""

pytest_plugins = (
    "support.copies",
    "support.dask",
    "support.s3_matrix",
    "support.s3",
    "support.tokenizers",
    "support.cloud",  # after support.s3, which it imports
    "support.ordering",  # the slowest modules first, for the parallel run
)
