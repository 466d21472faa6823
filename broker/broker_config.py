"""BrokerConfig: how one broker is run (its identity, endpoint, spools, timeouts, security).

``gazette serve`` builds one from its flags (broker/serve_cli.py); tests and the embedded mode
build one directly. The defaults are Gazette's where Gazette has one. Each field's meaning is
where the field is used; the comments here say what is not obvious from its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.append_receive import flow_control_burst_s_default, min_append_rate_bytes_per_s_default
from broker.fragment.store_health import HealthSchedule
from broker.fragments_api import first_refresh_wait_s_default
from broker.pipeline import pipeline_close_wait_s_default
from broker.read_staging import stage_bytes_max_default
from broker.replica import pulse_interval_s_default, shutdown_wait_s_default
from broker.resolver import revision_wait_s_default
from broker.tls import ClientTls, ServerTls
from broker.topology import DEFAULT_ROOT

# Member keys live this long without a keep-alive (etcd TTL, whole seconds).
lease_ttl_s_default = 20
# How long a stopping broker lets in-flight RPCs finish before cancelling them.
stop_grace_s_default = 1.0
# How long a stopping broker spends persisting the fragments its replicas completed last.
persist_drain_s_default = 30.0
# Gazette's default per-broker journal limit.
journal_limit_default = 1024


@dataclass(frozen=True)
class BrokerConfig:
    zone: str
    suffix: str
    root: str = DEFAULT_ROOT
    host: str = "127.0.0.1"
    port: int = 0
    journal_limit: int = journal_limit_default
    lease_ttl_s: int = lease_ttl_s_default
    # Directory of temporary (unlinked) spool files when there is no data_dir (None: the
    # system's temporary directory).
    spool_dir: str | None = None
    # The data directory: spools are durable files under <data_dir>/spools, recovered when the
    # broker restarts (fragment/spool_dir.py). None: spools are temporary files.
    data_dir: str | None = None
    # fdatasync spool content and commit records before acknowledging an append (and the
    # directories of new files), so that they survive power loss, not only the process.
    fsync: bool = False
    # Keep spools in memory, in blocks re-used across fragments (fragment/spool_blocks.py),
    # instead of files: faster; needs RAM for every open fragment; never durable (even with a
    # data_dir).
    memory_spools: bool = False
    pulse_interval_s: float = pulse_interval_s_default
    # Run the primary's pulse (tests that drive the append machine by hand turn it off).
    pulse_enabled: bool = True
    min_append_rate_bytes_per_s: int = min_append_rate_bytes_per_s_default
    flow_control_burst_s: float = flow_control_burst_s_default
    revision_wait_s: float = revision_wait_s_default
    shutdown_wait_s: float = shutdown_wait_s_default
    stop_grace_s: float = stop_grace_s_default
    persist_drain_s: float = persist_drain_s_default
    peer_response_timeout_s: float = 30.0
    pipeline_close_wait_s: float = pipeline_close_wait_s_default
    # How long a ListFragments waits for a replica's first store listing before UNAVAILABLE.
    fragments_listing_wait_s: float = first_refresh_wait_s_default
    # Pre-shared keys (base64, comma/space separated; see broker.auth); "": no authorization.
    auth_keys: str = field(default="", repr=False)
    # Serve TLS (advertising https://) with this certificate (broker.tls); None: in the clear.
    tls: ServerTls | None = None
    # What peers' https:// endpoints are trusted with (and, for mutual TLS, our certificate).
    peer_tls: ClientTls | None = None
    # When fragment stores are health-checked (fragment/store_health.py).
    store_health: HealthSchedule = field(default_factory=HealthSchedule)
    # Bytes a quorum journal's leader may hold in its entry log beyond what the fragment store
    # holds (QuorumConfig.log_bytes_max; None: its default, 64 MiB): appends past it are
    # refused RESOURCE_EXHAUSTED, and the log compacts at half of it.
    quorum_log_bytes_max: int | None = None
    # Stored fragments over 1 MiB are verified whole before a Read serves them: staged in
    # scratch files, at most this many bytes of them at once, else read twice (read_staging.py;
    # 0: always read twice).
    stage_bytes_max: int = stage_bytes_max_default
