"""Verifying fragment content: stored bytes in, content proven to be the fragment's out (sans-IO).

A fragment's name is its content address: its [begin, end) offsets and the SHA1 of its
uncompressed content (naming.py). A store keeps bytes, but nothing makes it keep *these*
bytes: a file can be truncated, emptied, deleted, replaced by other content, or damaged under
its codec. Gazette trusts the store; we check, wherever fragment files are read:

- `FragmentVerifier`: feed it the uncompressed content in order from the fragment's begin. It
  counts and hashes, raises as soon as there are more bytes than the fragment spans, and at
  `finish()` if there are fewer or the SHA1 differs from the name's.
- `VerifyingDecoder`: the stored (compressed) bytes in, decompressed and length-checked content
  out; `finish()` at the end of the file completes the check. `FragmentContentReader`
  (broker/client/reader.py) reads through it, so the broker's reads of stores and clients'
  direct reads of signed URLs are both verified; any other path reading fragment files (a
  `file://` path, a Spark task) can use it as is: it does no I/O.

The catch of streaming: a SHA1 can only be checked at the end of the fragment. A reader that
hands content out as it decodes has handed out the fragment's earlier bytes by the time a
mismatch shows; its error then says how many (`delivered`). A reader that can afford it
decodes a fragment whole and verifies it before handing out any byte (FragmentContentReader
does so up to a named bound), and a reader that stops inside a fragment (an `end_offset`) has
not verified it.

A non-empty fragment whose name carries the all-zero sum (Gazette's "no sum") is checked for
its length only: there is no digest to compare with.

Errors: `DataLossError` is content of a journal that should be readable and is lost or
corrupt; it is never retriable (reading again reads the same bytes). `FragmentIntegrityError`
is the detailed kind, naming the journal, the fragment (its content name and range), the store
and what was wrong (`IntegrityFailure`). Brokers answer it as the gRPC status DATA_LOSS;
clients raise DataLossError for that status (broker/client/reader.py).
"""

from __future__ import annotations

import enum
import hashlib

from broker.fragment import codecs, naming
from broker.protocol import protocol_pb2 as pb

__all__ = [
    "DataLossError",
    "FragmentContentError",
    "FragmentIntegrityError",
    "FragmentVerifier",
    "IntegrityFailure",
    "VerifyingDecoder",
    "describe_fragment",
]

_ZERO_SUM = pb.SHA1Sum()


class FragmentContentError(Exception):
    """A fragment's content could not be read as its fragment says (see the subclasses)."""


class DataLossError(Exception):
    """Content of `journal` that should be readable is lost or corrupt. Not retriable."""

    def __init__(self, journal: str, message: str) -> None:
        super().__init__(message)
        self.journal = journal


class IntegrityFailure(enum.Enum):
    """What was wrong with a fragment's stored file. Values label metrics."""

    SHA1_MISMATCH = "sha1_mismatch"
    """The content is as long as the fragment, but is other content."""
    SHORT = "short"
    """The file decodes to fewer bytes than the fragment spans (truncated)."""
    LONG = "long"
    """The file decodes to more bytes than the fragment spans."""
    EMPTY = "empty"
    """The file has no bytes at all."""
    UNDECODABLE = "undecodable"
    """The file is not a valid stream of the fragment's codec (corrupt or cut short)."""
    MISSING = "missing"
    """The file is not in the store, though the fragment index lists it."""


def describe_fragment(fragment: pb.Fragment) -> str:
    """`<content name> [begin, end)`, as errors name a fragment."""
    return f"{naming.content_name(fragment)} [{fragment.begin}, {fragment.end})"


class FragmentIntegrityError(DataLossError, FragmentContentError):
    """A fragment's stored file does not hold the fragment's content. `delivered` is how many
    of the fragment's bytes the reader had already handed out when it found out."""

    def __init__(
        self,
        fragment: pb.Fragment,
        store: str,
        failure: IntegrityFailure,
        detail: str,
        *,
        delivered: int = 0,
    ) -> None:
        text = (
            f"journal {fragment.journal}: fragment {describe_fragment(fragment)} in store"
            f" {store or '(none)'}: {detail}"
        )
        if delivered:
            text += f" ({delivered} bytes of it were already delivered to the reader)"
        super().__init__(fragment.journal, text)
        self.fragment = fragment
        self.store = store
        self.failure = failure
        self.detail = detail
        self.delivered = delivered

    def with_delivered(self, delivered: int) -> FragmentIntegrityError:
        """The same error, saying that `delivered` bytes had been handed out."""
        return FragmentIntegrityError(
            self.fragment, self.store, self.failure, self.detail, delivered=delivered
        )


class FragmentVerifier:
    """Counts and hashes a fragment's uncompressed content (see the module docstring).
    `store` names where the content came from, for errors (default: its backing store)."""

    def __init__(self, fragment: pb.Fragment, store: str = "") -> None:
        self.fragment = fragment
        self.store = store or fragment.backing_store
        self.span = fragment.end - fragment.begin
        self.length = 0
        self._check_sum = self.span > 0 and fragment.sum != _ZERO_SUM
        self._hash = hashlib.sha1()
        self._finished = False

    def error(self, failure: IntegrityFailure, detail: str) -> FragmentIntegrityError:
        return FragmentIntegrityError(self.fragment, self.store, failure, detail)

    def feed(self, content: bytes) -> None:
        """Take the next `content`; raises FragmentIntegrityError (LONG) past the span."""
        if self._finished:
            raise ValueError("FragmentVerifier: feed() after finish()")
        self.length += len(content)
        if self.length > self.span:
            raise self.error(
                IntegrityFailure.LONG,
                f"its file decodes to more than the fragment's {self.span} bytes",
            )
        if self._check_sum:
            self._hash.update(content)

    def finish(self) -> None:
        """The content ended: raises FragmentIntegrityError if it is short or its SHA1 is not
        the name's."""
        self._finished = True
        if self.length < self.span:
            raise self.error(
                IntegrityFailure.SHORT,
                f"its file decodes to {self.length} of the fragment's {self.span} bytes",
            )
        if self._check_sum:
            digest = self._hash.digest()
            want = naming.digest_of_sum(self.fragment.sum)
            if digest != want:
                raise self.error(
                    IntegrityFailure.SHA1_MISMATCH,
                    f"its content has SHA1 {digest.hex()}, not the {want.hex()} of its name",
                )


class VerifyingDecoder:
    """The stored bytes of a fragment file in (`feed`, then `finish` at the end of the file);
    its decompressed content out, verified as it goes and completely at `finish`."""

    def __init__(self, fragment: pb.Fragment, store: str = "") -> None:
        self.verifier = FragmentVerifier(fragment, store)
        self.stored_bytes = 0
        try:
            self._decompressor = codecs.new_decompressor(fragment.compression_codec)
        except codecs.CodecError as err:
            raise self.verifier.error(IntegrityFailure.UNDECODABLE, str(err)) from err

    def feed(self, stored: bytes) -> bytes:
        """Decode the next stored bytes; returns the content they complete (maybe none)."""
        self.stored_bytes += len(stored)
        try:
            out = self._decompressor.decompress(stored)
        except codecs.CodecError as err:
            raise self.verifier.error(IntegrityFailure.UNDECODABLE, str(err)) from err
        self.verifier.feed(out)
        return out

    def finish(self) -> bytes:
        """The file ended: returns the last content, or raises FragmentIntegrityError."""
        if self.stored_bytes == 0 and self.verifier.span > 0:
            raise self.verifier.error(
                IntegrityFailure.EMPTY,
                f"its file is empty (0 bytes) where the fragment spans {self.verifier.span}",
            )
        try:
            out = self._decompressor.close()
        except codecs.CodecError as err:
            raise self.verifier.error(IntegrityFailure.UNDECODABLE, str(err)) from err
        self.verifier.feed(out)
        self.verifier.finish()
        return out
