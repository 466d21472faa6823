"""Quorum replication (issue #16): majority-acknowledged appends with terms and fencing.

A sans-IO protocol core, per journal: the replica state machine of every member (`member`), the
leader's cursors and commit rule (`leader`, `quorum_ack`), the log each member keeps (`log`),
the coordinator that drives terms through a compare-and-swap register (`coordinator`,
`register`), and a deterministic simulation that checks the protocol's invariants (`sim`).
Nothing here does I/O or reads a clock: callers pass the time in ticks and carry the messages.
See docs/design/quorum.md.
"""
