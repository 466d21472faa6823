"""Named bounds on the sizes a request controls (docs/limits.md has the full table).

Gazette bounds the length of each name and value, but not how many of them one spec or request
may hold: a journal applied with 10,000 labels is valid to Gazette. Every count a request
controls is bounded here, each far above any real use of Gazette (so that a spec Gazette's users
write is never refused) and low enough that the work a broker does for one request stays within
milliseconds. A request over a limit is refused with INVALID_ARGUMENT, naming the limit and the
field, and changes nothing:

    labels: 10000 labels exceed labels_per_set_max (1024)

Specs read back from etcd are held to the same limits: one written by another tool beyond them
is left out of the mirror (logged), exactly as any other invalid spec.
"""

from __future__ import annotations

from typing import Final

# Labels of one LabelSet: a JournalSpec's or ShardSpec's labels, each side (include, exclude) of
# a LabelSelector, and each register set of an Append (check_registers' sides, union_registers,
# subtract_registers). Real specs carry a handful; 1024 is generous for tag-like use.
labels_per_set_max: Final = 1024

# Sources of one ShardSpec (journals a shard reads). Real shards read one or a few.
shard_sources_max: Final = 1024

# Hint backups of one ShardSpec. GetHints reads the primary hints and every backup in one etcd
# transaction, which etcd caps at 128 operations by default (--max-txn-ops).
hint_backups_max: Final = 127

# Characters of a label-selector string (parse_selector). A selector of a few dozen terms is
# under a KiB; the bound keeps a pathological string from costing seconds to parse.
selector_chars_max: Final = 1 << 16
