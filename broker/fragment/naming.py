"""Content-addressed names of fragment files, and their parsing back into Fragments.

A fragment file's name is a function of its content: begin and end offsets, the SHA1 of the
*uncompressed* bytes, and the codec's extension:

    %016x-%016x-%040x<ext>        e.g. 00000000000003e8-00000000000007d0-<40 hex digits>.gz

Stores hold it under `<store path><journal>/<path postfix>/<name>` (no postfix: no segment).
Because names are self-describing, a store listing alone tells the index which offsets each
file holds; nothing else needs to be stored. These rules are Gazette's and must stay
byte-identical: a Go broker and ours index each other's files.

The SHA1 travels on the wire as protocol.SHA1Sum, the 20-byte digest split into big-endian
words (part1 = bytes 0-7, part2 = 8-15, part3 = 16-19). An empty fragment is named with the
all-zero sum rather than SHA1(b""), as in Gazette.
"""

from __future__ import annotations

import hashlib
from typing import Final, cast

from broker.fragment.codecs import CompressionCodec
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validate import (
    JOURNAL_NAME_LEN_MAX,
    ValidationError,
    validate_journal_name,
    validate_path_component,
)

SHA1_DIGEST_BYTES: Final = 20
ZERO_DIGEST: Final = bytes(SHA1_DIGEST_BYTES)
# Offsets are int64 on the wire.
OFFSET_MAX: Final = (1 << 63) - 1
_OFFSET_HEX_DIGITS_MAX: Final = 16
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")

# Extensions written for each codec. GZIP_OFFLOAD_DECOMPRESSION is written with *no* extension,
# as Gazette's brokers do today (".gzod" is reserved for a future format version, and is
# accepted when parsing).
_EXTENSION_OF: Final[dict[CompressionCodec, str]] = {
    CompressionCodec.NONE: ".raw",
    CompressionCodec.GZIP: ".gz",
    CompressionCodec.ZSTANDARD: ".zst",
    CompressionCodec.SNAPPY: ".sz",
    CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION: "",
}
# Extensions accepted when parsing (case-insensitively), including Gazette's long forms.
_CODEC_OF_EXTENSION: Final[dict[str, CompressionCodec]] = {
    ".raw": CompressionCodec.NONE,
    ".gz": CompressionCodec.GZIP,
    ".gzip": CompressionCodec.GZIP,
    ".zst": CompressionCodec.ZSTANDARD,
    ".zstandard": CompressionCodec.ZSTANDARD,
    ".sz": CompressionCodec.SNAPPY,
    ".snappy": CompressionCodec.SNAPPY,
    "": CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION,
    ".gzod": CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION,
}


class FragmentNameError(ValidationError):
    """A fragment file name (or relative path) does not parse. `name` is the offending name."""

    def __init__(self, name: str, rule: str, *context: str) -> None:
        self.name = name
        super().__init__(f"{rule} in fragment name {name!r}", *context)


# --- Codec extensions -------------------------------------------------------------------------


def extension_of(codec: CompressionCodec | int) -> str:
    """The file extension written for `codec` (see the module docstring for GZIP_OFFLOAD)."""
    try:
        return _EXTENSION_OF[CompressionCodec(codec)]
    except (KeyError, ValueError):
        raise ValidationError(f"invalid compression codec ({codec})", "compression_codec") from None


def codec_from_extension(ext: str) -> CompressionCodec:
    """The codec of a file extension (with its dot; "" for none), case-insensitively."""
    try:
        return _CODEC_OF_EXTENSION[ext.lower()]
    except KeyError:
        raise ValidationError(f"unrecognized compression extension {ext!r}") from None


def pb_codec(codec: CompressionCodec | int) -> pb.CompressionCodec:
    """`codec` as the protocol enum type, for building protocol.Fragment values (the wire enum
    is a plain int at run time, with the same values)."""
    return cast(pb.CompressionCodec, int(CompressionCodec(codec)))


# --- SHA1 sums --------------------------------------------------------------------------------


def sum_from_digest(digest: bytes) -> pb.SHA1Sum:
    """A protocol.SHA1Sum from a 20-byte digest, split into big-endian words."""
    if len(digest) != SHA1_DIGEST_BYTES:
        raise ValidationError(f"SHA1 digest must be {SHA1_DIGEST_BYTES} bytes (got {len(digest)})")
    return pb.SHA1Sum(
        part1=int.from_bytes(digest[0:8], "big"),
        part2=int.from_bytes(digest[8:16], "big"),
        part3=int.from_bytes(digest[16:20], "big"),
    )


def digest_of_sum(sha1_sum: pb.SHA1Sum) -> bytes:
    """The 20-byte digest of a protocol.SHA1Sum (inverse of sum_from_digest)."""
    return (
        sha1_sum.part1.to_bytes(8, "big")
        + sha1_sum.part2.to_bytes(8, "big")
        + sha1_sum.part3.to_bytes(4, "big")
    )


def content_sum(content: bytes) -> pb.SHA1Sum:
    """The SHA1Sum naming a fragment of `content` (uncompressed): all-zero when empty."""
    if not content:
        return pb.SHA1Sum()
    return sum_from_digest(hashlib.sha1(content).digest())


# --- Names and paths --------------------------------------------------------------------------


def content_name(fragment: pb.Fragment) -> str:
    """The fragment's content-addressed file name, e.g. "<begin>-<end>-<sha1>.gz"."""
    return "%016x-%016x-%s%s" % (  # noqa: UP031 -- mirrors Gazette's format string.
        fragment.begin,
        fragment.end,
        digest_of_sum(fragment.sum).hex(),
        extension_of(fragment.compression_codec),
    )


def content_path(fragment: pb.Fragment) -> str:
    """`<journal>/<path postfix>/<content name>`, the postfix segment omitted when empty.

    Journal names and postfixes are validated clean paths, so joining with '/' equals Go's
    path.Join here."""
    parts = [fragment.journal, fragment.path_postfix, content_name(fragment)]
    return "/".join(p for p in parts if p)


def rewrite_path(path: str, find: str = "", replace: str = "") -> str:
    """Gazette's store path rewriting: replace the first `find` in `path` with `replace`.

    Lets a store keep serving files written under an older journal naming scheme."""
    if not find:
        return path
    return path.replace(find, replace, 1)


def object_key(prefix: str, fragment: pb.Fragment, find: str = "", replace: str = "") -> str:
    """Key of the fragment's file in a store rooted at `prefix` (the store URL's path without
    its leading '/', so either "" or ending in '/')."""
    return prefix + rewrite_path(content_path(fragment), find, replace)


def journal_prefix(prefix: str, journal: str, find: str = "", replace: str = "") -> str:
    """Key prefix under which every file of `journal` (every postfix) lives in a store."""
    return prefix + rewrite_path(journal, find, replace) + "/"


def _parse_offset(name: str, field: str, text: str) -> int:
    if not 1 <= len(text) <= _OFFSET_HEX_DIGITS_MAX or not set(text) <= _HEX_DIGITS:
        raise FragmentNameError(name, f"must be 1 to 16 hex digits (got {text!r})", field)
    value = int(text, 16)
    if value > OFFSET_MAX:
        raise FragmentNameError(name, f"must fit in an int64 (got {text!r})", field)
    return value


def parse_content_name(name: str) -> tuple[int, int, pb.SHA1Sum, CompressionCodec]:
    """(begin, end, sum, codec) of a content name such as "<begin>-<end>-<sha1>.gz"."""
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    else:
        ext = "." + ext
    fields = stem.split("-")
    if len(fields) != 3:
        raise FragmentNameError(name, "expected <begin>-<end>-<sha1> then an extension")
    begin = _parse_offset(name, "begin", fields[0])
    end = _parse_offset(name, "end", fields[1])
    if begin > end:
        raise FragmentNameError(name, f"must be <= end (got {begin} > {end})", "begin")
    sum_hex = fields[2]
    if len(sum_hex) != 2 * SHA1_DIGEST_BYTES or not set(sum_hex) <= _HEX_DIGITS:
        raise FragmentNameError(name, f"must be 40 hex digits (got {sum_hex!r})", "sum")
    try:
        codec = codec_from_extension(ext)
    except ValidationError as err:
        raise FragmentNameError(name, err.rule, "compression_codec") from None
    return begin, end, sum_from_digest(bytes.fromhex(sum_hex)), codec


def parse_fragment_from_relative_path(journal: str, rel_path: str) -> pb.Fragment:
    """Parse a Fragment from its path relative to the journal's directory in a store: an
    optional path postfix, then the content name. E.g. for journal "a/journal":

        "a=1/b=2/00000000499602d2-7fffffffffffffff-0102...1314.gz"
    """
    postfix, _, name = rel_path.rpartition("/")
    try:
        validate_journal_name(journal)
    except ValidationError as err:
        raise FragmentNameError(rel_path, err.rule, "journal") from None
    if postfix:
        try:
            validate_path_component(postfix, 0, JOURNAL_NAME_LEN_MAX)
        except ValidationError as err:
            raise FragmentNameError(rel_path, err.rule, "path_postfix") from None
    begin, end, sha1_sum, codec = parse_content_name(name)
    return pb.Fragment(
        journal=journal,
        begin=begin,
        end=end,
        sum=sha1_sum,
        compression_codec=pb_codec(codec),
        path_postfix=postfix,
    )


def is_canonical(fragment: pb.Fragment, rel_path: str) -> bool:
    """Whether `rel_path` is exactly the path we would write for the parsed `fragment`.

    Parsing is lenient (upper-case hex, short offsets, long extensions) like Gazette's, but
    a store is opened by canonical key; a file whose name is not canonical cannot be opened by
    its Fragment, so listings skip it instead of indexing content they cannot serve."""
    rel = content_path(fragment)[len(fragment.journal) + 1 :]
    return rel == rel_path
