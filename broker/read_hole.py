"""A blocking read's wait for a fragment to cover its offset, which is not silent at a hole.

A hole is an offset below the write head that no fragment covers: a former primary's fragment
not listed yet (normal for seconds after a failover), or one that will never come (its upload
was lost). The index keeps such a read waiting, since a listing may still fill the hole, and
jumps it only once the fragment after it is hours old (``fragment/index.py``,
``offset_jump_age_s``). Served reads (``broker/read_api.py``) wait here, so that a read still
waiting at a hole after ``hole_wait_warning_s`` is logged as a WARNING naming the journal, the
offset and the write head, and counted (``gazette_read_hole_waits_total``), once per hole; it
then keeps waiting as before. A read waiting at the write head (tailing) is never reported.
"""

from __future__ import annotations

from typing import Final

from broker import metrics
from broker.fragment.index import FragmentIndex, QueryResult
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

log = get_logger(__name__)

# How long a blocking read may wait at a hole below the write head before it is logged as a
# WARNING and counted (see the module docstring). Long enough that a former primary's upload
# being listed after a failover (seconds) stays quiet.
hole_wait_warning_s_default: Final = 60.0


async def wait_covered(
    index: FragmentIndex, req: pb.ReadRequest, hole_wait_warning_s: float
) -> QueryResult:
    """``index.wait_for`` the read's offset, warning once if it waits past
    ``hole_wait_warning_s`` at a hole below the write head (see the module docstring)."""
    result = index.query(req.offset, begin_mod_time=req.begin_mod_time)
    if result.found or result.lost is not None:
        return result
    offset = result.offset  # An offset of -1 is resolved to the write head once, as wait_for.
    warned = False
    while True:
        try:
            return await index.wait_for(
                offset,
                begin_mod_time=req.begin_mod_time,
                timeout_s=None if warned else hole_wait_warning_s,
            )
        except TimeoutError:
            result = index.query(offset, begin_mod_time=req.begin_mod_time)
            if result.found or result.lost is not None:
                return result
            if result.offset < result.write_head:
                warned = True
                metrics.READ_HOLE_WAITS.inc()
                log.warning(
                    "blocking read waits at a hole below the write head: no fragment covers"
                    " its offset",
                    journal=req.journal,
                    offset=result.offset,
                    write_head=result.write_head,
                    waited_s=hole_wait_warning_s,
                )
            offset = result.offset
