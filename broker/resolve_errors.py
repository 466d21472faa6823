"""The errors of resolving a request to a journal's broker (broker/resolver.py), in a module of
their own: the RPC layer maps them to gRPC statuses without importing the resolver (and with it
the replica, pipeline and store machinery) into every process that only serves RPCs."""

from __future__ import annotations


class ResolveError(Exception):
    """A request cannot be resolved at all (as opposed to resolving to a non-OK status)."""


class ResolverStoppedError(ResolveError):
    """The resolver no longer serves local replicas (the broker is shutting down)."""


class ReplicaNotReadyError(ResolveError):
    """The journal resolved to this broker, whose replica of it is not running (yet)."""


class ProxyTargetMismatchError(ResolveError):
    """A proxied request names another broker than this one: the proxying broker's view of the
    route is behind (the broker at that endpoint restarted, and has not announced itself yet,
    or another took its address). Transient: the proxy's next attempt, once its view moves on,
    reaches the right broker."""
