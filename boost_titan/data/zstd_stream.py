"""Read a `.zst` file as a stream of bytes (`zstandard`), every frame, and refuse a
truncated one.

`zstandard`'s own `stream_reader` ends quietly where a cut file ends, so a corpus truncated
by a failed download would be prepared short without a word; here a stream that ends inside
a frame raises EOFError, as `gzip`, `bz2` and `lzma` do, and bytes that are no zstd
frame raise OSError (as gzip's BadGzipFile).
"""

from __future__ import annotations

import io

CHUNK = 1 << 20
"""Compressed bytes read at a time."""


class ZstdStream(io.RawIOBase):
    """The decompressed bytes of the frames of a zstd file, one after another."""

    def __init__(self, path: str) -> None:
        import zstandard

        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._context = zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._in_frame = False  # bytes of an unfinished frame were fed
        self._ready = memoryview(b"")
        self._errors = zstandard.ZstdError

    def readable(self) -> bool:
        return True

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame.eof:
                self._frame = self._context.decompressobj()
            try:
                out.append(self._frame.decompress(data))
            except self._errors as e:
                raise OSError(str(e)) from None
            self._in_frame = not self._frame.eof
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._ready:
            data = self._file.read(CHUNK)
            if not data:
                if self._in_frame:
                    raise EOFError("zstd stream ended before the end of its frame")
                return 0
            self._ready = memoryview(self._decompress(data))
        n = min(len(buffer), len(self._ready))
        buffer[:n] = self._ready[:n]
        self._ready = self._ready[n:]  # a view: no copy
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


def open_zstd(path: str) -> io.BufferedReader:
    """`path`'s decompressed bytes, buffered (readline works)."""
    return io.BufferedReader(ZstdStream(path), CHUNK)
