"""What the etcd-out-of-space tests share: a real etcd with a small quota, filled by another
client until its NOSPACE alarm is raised, and the operator's way out (etcd's documented
steps, with etcdctl): delete, compact, defragment, disarm."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Final

import pytest

from broker.keyspace.backend import NoSpaceError
from broker.keyspace.etcd import EtcdBackend
from broker.testing.process_cluster import ProcessCluster

requires_etcdctl = pytest.mark.skipif(
    shutil.which("etcdctl") is None, reason="etcdctl not installed: run `make system-deps`"
)
QUOTA_BYTES: Final = 4 << 20
# etcd checks a put against the quota by the size of its database file, which grows only when
# its backend commits: every 100 ms by default, so a fast filler could put many times the quota
# before the first refusal (CI saw 16 x 1 MiB fit in 4 MiB). A commit per operation makes the
# refusal come at the quota, on every machine.
QUOTA_ARGS: Final = (f"--quota-backend-bytes={QUOTA_BYTES}", "--backend-batch-limit=1")
FILLER_PREFIX: Final = b"/filler/"
FILLER_VALUE_BYTES: Final = 1 << 20
# Bound on the filler's puts: the quota is reached well before.
FILLERS_MAX: Final = 4 * QUOTA_BYTES // FILLER_VALUE_BYTES
ETCDCTL_WAIT_S: Final = 30.0


def etcdctl(cluster: ProcessCluster, *args: str) -> str:
    done = subprocess.run(
        ["etcdctl", "--endpoints", cluster.etcd.endpoint, *args],
        capture_output=True,
        text=True,
        timeout=ETCDCTL_WAIT_S,
        check=True,
        env={**os.environ, "ETCDCTL_API": "3"},
    )
    return done.stdout


async def fill(admin: EtcdBackend) -> NoSpaceError:
    """Put FILLER_VALUE_BYTES values until etcd refuses one for want of space; that refusal."""
    value = os.urandom(FILLER_VALUE_BYTES)
    for i in range(FILLERS_MAX):
        try:
            await admin.put(FILLER_PREFIX + str(i).encode(), value)
        except NoSpaceError as err:
            return err
    raise AssertionError(f"{FILLERS_MAX} puts of {FILLER_VALUE_BYTES} bytes all fit")


async def make_room(cluster: ProcessCluster, admin: EtcdBackend) -> None:
    """The operator's way out: the filler goes; etcd is compacted, defragmented, disarmed."""
    header, _ = await admin.delete(FILLER_PREFIX, FILLER_PREFIX[:-1] + b"0")
    etcdctl(cluster, "compact", str(header.revision))
    etcdctl(cluster, "defrag")
    etcdctl(cluster, "alarm", "disarm")
    assert etcdctl(cluster, "alarm", "list").strip() == ""
