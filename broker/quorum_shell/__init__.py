"""The broker's shell around the quorum protocol core (broker/quorum) for journals labelled
`gazette.dev/replication-mode=quorum`: the term register in the keyspace (term_record,
term_register), the replication RPC (wire, transport), a node per journal (node), the broker's
set of them (journals), Journal.Append for them (append), committed entries into the spool
(apply), their pulse (pulse), the route clients are told (leader_route), and the refusal when
no shell is present (dispatch).
See docs/design/quorum.md."""
