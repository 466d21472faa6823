"""Incremental compression of a spool's content file.

A fragment file is stored compressed with the fragment's codec. The primary compresses committed
content incrementally as it commits (in batches of at least `compress_batch_bytes_min`), so the
cost is spread over appends and a completed fragment can be persisted at once. Replicas do not
compress: only the primary persists promptly, and a replica that does need to persist compresses
on demand with `compress_file`. Compression is a cache of the content file, never a source of
truth: on any I/O error it is dropped and rebuilt from the content file.

Sans-IO apart from the SpoolFiles it reads and writes through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from broker.fragment import codecs
from broker.fragment.spool_file import SpoolFile
from broker.fragment.spool_types import SpoolInvariantError

# The primary compresses committed content once at least this much awaits compression. Small
# batches would pay per-call overhead (and, for some codecs, framing) on every small append.
compress_batch_bytes_min_default: Final = 1 << 20
# Content is read back from the content file for compression in pieces of at most this size,
# which bounds the memory one compression step holds.
compress_chunk_bytes_max: Final = 1 << 20


class IncrementalCompression:
    """The compressed form of a content file's prefix, extended as more of it commits."""

    __slots__ = ("_compressor", "_file", "length", "through")

    def __init__(self, codec: codecs.CompressionCodec, new_file: Callable[[], SpoolFile]) -> None:
        self._compressor = codecs.new_compressor(codec)
        self._file = new_file()
        self.through = 0  # Content bytes compressed so far.
        self.length = 0  # Compressed bytes written so far.

    def extend(self, content: SpoolFile, through: int) -> None:
        """Compress content [self.through, through). On error this object is unusable."""
        if through < self.through:
            raise SpoolInvariantError(f"compression cannot go back ({through} < {self.through})")
        while self.through < through:
            want = min(compress_chunk_bytes_max, through - self.through)
            chunk = content.pread(want, self.through)
            if len(chunk) != want:
                raise SpoolInvariantError(
                    f"content file is short: read {len(chunk)} of {want} bytes at {self.through}"
                )
            self._write(self._compressor.compress(chunk))
            self.through += want

    def finish(self) -> tuple[SpoolFile, int]:
        """End the stream; return the file and the length of its compressed content."""
        self._write(self._compressor.close())
        return self._file, self.length

    def discard(self) -> None:
        self._file.close()

    def _write(self, data: bytes) -> None:
        if data:
            self._file.pwrite(data, self.length)
            self.length += len(data)


def compress_file(
    codec: codecs.CompressionCodec | int,
    content: SpoolFile,
    length: int,
    new_file: Callable[[], SpoolFile],
) -> tuple[SpoolFile, int]:
    """Compress content [0, length) into a new file: for a persister holding a CompletedSpool
    whose `compressed_file` is None. Returns the file and its compressed length."""
    compression = IncrementalCompression(codecs.CompressionCodec(codec), new_file)
    try:
        compression.extend(content, length)
        return compression.finish()
    except BaseException:
        compression.discard()
        raise
