"""What a full disk looks like to Python: an OSError whose errno says no room is left.

A full disk is a condition an operator fixes (frees room, grows the volume) while the process
goes on: the broker's quorum logs and the consumer's shards retry it after a back-off instead
of failing for good. Both ask the same question here, so they agree on what counts.
"""

from __future__ import annotations

import errno
from typing import Final, TypeGuard

# ENOSPC: the file system is full. EDQUOT: the user's quota on it is.
DISK_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(err: BaseException) -> TypeGuard[OSError]:
    """Whether `err` is an OSError of a full disk (or quota)."""
    return isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS
