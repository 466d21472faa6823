"""The offset of a journal where a timestamp begins: options startingTimestamp / endingTimestamp.

A Gazette message carries the time it was published in its UUID's clock. Messages of several
producers interleave in a journal, so clocks need not rise with offsets; "the offset of time T"
is therefore taken as Kafka takes a timestamp: the offset of the first message, in journal
order, whose time is at or after T (the write head if there is none). A read from it returns
every message from there on, including later ones with earlier clocks.

To avoid reading the whole journal, fragments persisted (their files' modification time)
before T, less `clock_skew_s`, are passed over: every message they hold was appended before
they were persisted, so (clocks agreeing within the skew) is older than T. The rest is read in
order, a decoded batch at a time, until a message at or after T.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from spark_integration.range_decode import DecoderFactory, decoded
from spark_integration.read_plan import JournalInfo, ReadContext
from spark_integration.uuid_columns import clock_of_unix_micros

# How far producers' clocks may run ahead of the store's, for passing over whole fragments.
clock_skew_s: Final = 60


async def offset_at_time(
    ctx: ReadContext, info: JournalInfo, timestamp_ms: int, new_decoder: DecoderFactory
) -> int:
    """The offset of the first message of `info`'s journal at or after `timestamp_ms`."""
    cutoff_s = timestamp_ms // 1000 - clock_skew_s
    begin = info.fragments.begin
    for ref in info.fragments.fragments:
        mod_time = ref.fragment().mod_time
        if mod_time and mod_time < cutoff_s:
            begin = ref.end
        else:
            break
    clock = clock_of_unix_micros(timestamp_ms * 1000)
    source = ctx.source(info.name, info.fragments.overlapping(begin, info.head))
    async for batch in decoded(source, begin, info.head, new_decoder):
        at = np.flatnonzero(batch.clocks >= np.uint64(clock))
        if len(at):
            return int(batch.begins[at[0]])
    return info.head
