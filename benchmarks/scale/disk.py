"""What a short shard costs on disk, per kind: one record of one element, frame or document.

Run: ``python -m benchmarks.scale.disk --label after``.

Per kind, a dataset of 1,000 shards of one tiny record each: objects, bytes (the objects'
sizes: what an object store bills) and bytes allocated on this filesystem, per shard.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.scale import harness

SHARDS = 1000


def run(label: str) -> dict:
    data = harness.work_dir(label, "disk")
    result: dict[str, Any] = {"library": harness.code_version()}
    for kind in harness.KINDS:
        url = harness.fresh_dir(data / kind) / "ds"
        harness.write_records(kind, str(url), SHARDS, SHARDS)
        files, logical, allocated = harness.directory_bytes(Path(url) / "data")
        shard = next(Path(url).glob("data/*/shards/0"))
        s_files, s_logical, s_allocated = harness.directory_bytes(shard)
        result[kind] = {
            "objects_per_shard": s_files,
            "bytes_per_shard": s_logical,
            "allocated_per_shard": s_allocated,
            "dataset_objects": files,
            "dataset_bytes": logical,
            "dataset_allocated": allocated,
            "arrays": {
                array.name: harness.directory_bytes(array)[1]
                for array in sorted(shard.iterdir())
                if array.is_dir()
            },
        }
        print(kind, result[kind], flush=True)
        harness.shutil.rmtree(data / kind)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    args = parser.parse_args()
    print(harness.save(args.label, "disk", run(args.label)))


if __name__ == "__main__":
    main()
