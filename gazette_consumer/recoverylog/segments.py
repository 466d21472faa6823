"""Log segments: runs of consecutive ops by one author, as FSMHints describe them (sans-IO).

A hint lists, per live file, the segments holding its ops. A player merges them into one
ordered, non-overlapping sequence (`merge_segments`) and reads only those parts of the log,
skipping the obsolete history between them. Offsets in segments are *lower bounds* of where
their ops begin when a recorder produced them (it knows the write head before its append, not
the exact offset), and exact when a player did.

Only segments of the hints' own log are supported: Gazette allows hints to span several logs
(a shard whose recovery log was renamed); that is left for when a shard needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from broker.protocol.recorded_op_pb2 import Segment as SegmentProto

__all__ = ["InvalidHintsError", "Segment", "merge_segments"]


class InvalidHintsError(ValueError):
    """FSMHints (or a segment of them) contradict themselves; the message names the part."""


@dataclass(frozen=True)
class Segment:
    """See recorded_op.proto's Segment. `last_offset` 0 means unknown (unbounded)."""

    author: int
    first_seq_no: int
    first_offset: int
    first_checksum: int
    last_seq_no: int
    last_offset: int = 0
    log: str = ""

    @classmethod
    def from_proto(cls, proto: SegmentProto, default_log: str) -> Segment:
        segment = cls(
            author=proto.author,
            first_seq_no=proto.first_seq_no,
            first_offset=proto.first_offset,
            first_checksum=proto.first_checksum,
            last_seq_no=proto.last_seq_no,
            last_offset=proto.last_offset,
            log=proto.log or default_log,
        )
        segment.validate()
        return segment

    def to_proto(self, hints_log: str) -> SegmentProto:
        return SegmentProto(
            author=self.author,
            first_seq_no=self.first_seq_no,
            first_offset=self.first_offset,
            first_checksum=self.first_checksum,
            last_seq_no=self.last_seq_no,
            last_offset=self.last_offset,
            # Hints leave a segment's log empty where it is the hints' own.
            log="" if self.log == hints_log else self.log,
        )

    def validate(self) -> None:
        if self.author == 0:
            raise InvalidHintsError(f"segment {self}: author must be non-zero")
        if self.first_seq_no <= 0:
            raise InvalidHintsError(f"segment {self}: first_seq_no must be > 0")
        if self.first_offset < 0:
            raise InvalidHintsError(f"segment {self}: first_offset must be >= 0")
        if self.last_seq_no < self.first_seq_no:
            raise InvalidHintsError(f"segment {self}: last_seq_no must be >= first_seq_no")
        if self.last_offset != 0 and self.last_offset <= self.first_offset:
            raise InvalidHintsError(f"segment {self}: last_offset must be 0 or > first_offset")
        if not self.log:
            raise InvalidHintsError(f"segment {self}: log must be set")


def merge_segments(segments: list[Segment]) -> list[Segment]:
    """Order `segments` by sequence number and merge those that overlap or are adjacent and of
    one author, into the sequence of log ranges a player must read. Overlapping segments of
    different authors, or equal first sequence numbers with different checksums, contradict
    each other (two histories claim the same ops): InvalidHintsError."""
    merged: list[Segment] = []
    for segment in sorted(segments, key=lambda s: (s.first_seq_no, -s.last_seq_no)):
        if not merged:
            merged.append(segment)
            continue
        last = merged[-1]
        if segment.first_seq_no == last.first_seq_no and (
            segment.first_checksum != last.first_checksum
        ):
            raise InvalidHintsError(f"segments {last} and {segment}: first checksums differ")
        if segment.first_seq_no > last.last_seq_no + 1 or (
            segment.first_seq_no == last.last_seq_no + 1 and segment.author != last.author
        ):
            if segment.first_offset < last.first_offset:
                raise InvalidHintsError(f"segments {last} and {segment}: offsets not monotonic")
            merged.append(segment)
            continue
        if segment.author != last.author or segment.log != last.log:
            raise InvalidHintsError(f"segments {last} and {segment}: overlap across authors")
        if segment.last_seq_no > last.last_seq_no:
            merged[-1] = replace(
                last, last_seq_no=segment.last_seq_no, last_offset=segment.last_offset
            )
        elif segment.last_seq_no == last.last_seq_no and not last.last_offset:
            merged[-1] = replace(last, last_offset=segment.last_offset)
    return merged
