"""Go's time.Format now lives in `broker/protocol/go_time.py` (beside the path postfix templates
that use it); re-exported here for callers of the old path."""

from __future__ import annotations

from broker.protocol.go_time import GO_ZERO_TIME as GO_ZERO_TIME
from broker.protocol.go_time import LayoutChunk as LayoutChunk
from broker.protocol.go_time import format_time as format_time
from broker.protocol.go_time import parse_layout as parse_layout
from broker.protocol.go_time import time_method as time_method
