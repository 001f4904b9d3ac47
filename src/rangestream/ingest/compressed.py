"""Compressed inputs read to their very end: a cut file is an error, not a short file."""

from __future__ import annotations

import io
from typing import IO, Any

__all__ = ["ZstdFrames"]


class ZstdFrames(io.RawIOBase):
    """Zstandard frames, one after another, to the end of the file, which must end a frame.

    ``zstandard``'s stream reader stops after the first frame, and ends silently at a cut
    inside one; a conversion must read every frame and learn of a cut file.
    """

    def __init__(self, raw: IO[bytes], url: str) -> None:
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self.raw, self.url = raw, url
        self._frame = self._new()
        self._in_frame = False
        self._pending = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending and not self._done:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self._in_frame:
                    raise EOFError(f"{self.url}: the last zstd frame is cut")
                self._done = True
                break
            out = []
            while chunk:
                out.append(self._frame.decompress(chunk))
                self._in_frame = True
                if not self._frame.eof:
                    break
                chunk, self._frame, self._in_frame = self._frame.unused_data, self._new(), False
            self._pending = b"".join(out)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def close(self) -> None:
        self.raw.close()
        super().close()
