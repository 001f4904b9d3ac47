"""The command line: one calling convention, ``--version``, one error path for failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage, __version__
from rangestream.cli.main import main
from testkit import S3Endpoint

TOKENS = np.dtype([("t", "<i4")])
COMMANDS = ["inspect", "verify", "gc"]
UNKNOWN_KEYS = ["--storage-option", "key=a", "--storage-option", "secret=b", "--timeout", "1"]


def write_small(url: str, options: dict[str, object] | None = None) -> None:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    with storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(100, dtype="<i4")})


def failed_with_one_line(
    code: int, capsys: pytest.CaptureFixture[str], command: str, *expected: str
) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rangestream {command}: "), captured.err
    assert "Traceback" not in captured.err
    for text in expected:
        assert text in lines[0]
    return lines[0]


def test_version_is_printed_by_the_installed_command() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "rangestream.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout.strip() == f"rangestream {__version__}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_the_url_as_its_positional_argument(
    command: str, location: Location, capsys: pytest.CaptureFixture[str]
) -> None:
    write_small(location.url, location.storage_options)
    options = [f"--storage-option=key={location.storage_options['key']}",
               f"--storage-option=secret={location.storage_options['secret']}",
               "--endpoint-url", location.storage_options["client_kwargs"]["endpoint_url"]] \
        if location.is_s3 else []  # fmt: skip
    assert main([command, location.url, *options]) == 0
    assert location.url in capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_dataset_is_one_line_and_exit_code_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, str(tmp_path / "nothing")])
    if command == "gc":  # nothing committed and nothing written: nothing to collect
        assert code == 0
        return
    failed_with_one_line(code, capsys, command, "no dataset at")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_in_place_of_a_dataset_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tokens.bin").write_bytes(b"\x00" * 64)
    code = main([command, str(tmp_path / "tokens.bin")])
    failed_with_one_line(code, capsys, command, "is a file; a dataset is a directory")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_host_is_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--endpoint-url", "http://no-such-host.invalid:9"]
    code = main([command, "s3://bucket/data", *endpoint, *UNKNOWN_KEYS])
    failed_with_one_line(code, capsys, command, "s3://bucket/data")


@pytest.mark.parametrize("endpoint", ["localhost:9000", "http://[::1"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_malformed_endpoint_is_one_line(
    command: str, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, "s3://bucket/data", "--endpoint-url", endpoint, *UNKNOWN_KEYS])
    failed_with_one_line(code, capsys, command)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_request_403_is_one_line(
    command: str, s3_url: Location, s3_server: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    write_small(s3_url.url, s3_url.storage_options)
    code = main([command, s3_url.url, "--endpoint-url", s3_server.endpoint_url,
                 "--storage-option", f"key={s3_server.access_key}",
                 "--storage-option", "secret=wrong", "--timeout", "5"])  # fmt: skip
    line = failed_with_one_line(code, capsys, command)
    assert "403" in line or "denied" in line.lower() or "Forbidden" in line


def test_storage_options_take_dotted_keys_and_json_values(
    s3_url: Location, s3_server: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    write_small(s3_url.url, s3_url.storage_options)
    code = main(["inspect", s3_url.url, "--json",
                 "--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}",
                 "--storage-option", f"key={s3_server.access_key}",
                 "--storage-option", f"secret={s3_server.secret_key}",
                 "--storage-option", 'config_kwargs={"connect_timeout": 3}'])  # fmt: skip
    assert code == 0 and '"elements": 100' in capsys.readouterr().out


def test_a_malformed_storage_option_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["inspect", str(tmp_path), "--storage-option", "no-equals-sign"])
    failed_with_one_line(code, capsys, "inspect", "KEY=VALUE")


def test_the_former_url_option_still_works(tmp_path: Path) -> None:
    write_small(str(tmp_path / "ds"))
    assert main(["inspect", "--url", str(tmp_path / "ds")]) == 0


def test_an_unreachable_endpoint_is_announced_within_5_s_while_it_is_retried() -> None:
    import socket
    import time

    with socket.socket() as probe:  # a port nobody listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "rangestream.cli.main", "inspect", "s3://bucket/data",
         "--endpoint-url", f"http://127.0.0.1:{port}", "--storage-option", "key=a",
         "--storage-option", "secret=b", "--timeout", "60"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        took = time.monotonic() - started
        assert process.poll() is None, "still retrying: the deadline is a minute away"
    finally:
        process.kill()
        process.wait()
    assert line.startswith("rangestream inspect: cannot reach the object store"), line
    assert f"127.0.0.1:{port}" in line and "retrying for up to" in line
    # Within 5 s of the command's first request (the 60 s deadline starts there), read from
    # the notice itself: the interpreter's start is not the library's (it took 5.3 s of
    # the wall time on a loaded machine).
    left = float(line.split("retrying for up to ")[1].split(" s more")[0])
    assert left >= 55, f"announced {60 - left:.0f} s into the retries ({took:.1f} s after start)"
