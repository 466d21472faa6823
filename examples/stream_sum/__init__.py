"""Stream sum: an exactly-once workload that checks itself (after Gazette's examples/stream-sum).

Chunkers publish interleaved streams of sequence-numbered chunks; summers (``Summer``, a consumer
Application) fold each stream's chunks in order, failing loudly on a gap or a repeat, and publish
each stream's final sum; chunkers verify every sum. See README.md, and ``soak`` for the
fault-injection soak built on it.
"""

from examples.stream_sum.chunker import Chunker, ChunkerConfig
from examples.stream_sum.layout import Layout, ShardPlan, default_layout
from examples.stream_sum.messages import Chunk, SequenceViolation, StreamState, Sum, fold
from examples.stream_sum.summer import Summer
from examples.stream_sum.verifier import Finding, SumVerifier, read_sums

__all__ = [
    "Chunk",
    "Chunker",
    "ChunkerConfig",
    "Finding",
    "Layout",
    "SequenceViolation",
    "ShardPlan",
    "StreamState",
    "Sum",
    "SumVerifier",
    "Summer",
    "default_layout",
    "fold",
    "read_sums",
]
