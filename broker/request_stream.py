"""Answering a client-streaming RPC (Append) before the client has finished sending.

A client of a client-streaming RPC hears the answer only once it stops writing. When the broker
ends the RPC with a gRPC error status (a refused authorization, a malformed request, a broker
that cannot serve the journal yet: UNAVAILABLE, which clients retry) while the client is still
writing, the HTTP/2 stream is closed under the client's next write. Go's gRPC then reports the
server's status; grpc.aio (Python) sometimes reports INTERNAL "Failed execute_batch" instead,
having overwritten the status it had already received (grpc issue 36066). A Python client would
see the append fail for no stated reason, and not retry. (In-band refusals, such as a register
mismatch, are responses with status OK at the gRPC level and were not seen to be lost.)

So before it answers early, the broker reads and discards what the client still sends, until
the client half-closes (our Appender sends its commit chunk and half-closes, however the write
went): the client's writes all succeed, and it then reads the broker's answer. The reading is
bounded in time and in messages, so that a client streaming without end cannot hold the broker;
past the bound the broker answers anyway and the client may see INTERNAL, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

# How long an early answer waits for the client to finish sending, and how many of its
# messages it reads meanwhile (Appender chunks are <= 1 MiB: 4096 of them are 4 GiB, so the
# time bound is the one that holds in practice).
early_answer_read_s: Final = 2.0
early_answer_messages_max: Final = 4096
# The same for a client refused authorization, tighter: it costs nothing to send garbage.
refusal_read_s: Final = 0.5
refusal_messages_max: Final = 256


async def read_to_end(
    stream: AsyncIterator[Any],
    *,
    seconds: float = early_answer_read_s,
    messages_max: int = early_answer_messages_max,
) -> bool:
    """Read and discard `stream` until it ends, for at most `seconds` and `messages_max`
    messages. Whether it ended (False: a bound was reached, or the client went away)."""
    try:
        async with asyncio.timeout(seconds):
            for _ in range(messages_max):
                await anext(stream)
    except StopAsyncIteration:
        return True
    except TimeoutError:
        return False
    except Exception:  # The client cancelled, or sent a malformed message: it went away.
        return False
    return False
