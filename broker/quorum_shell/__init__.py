"""The broker's shell around the quorum protocol core (broker/quorum): the term register in
the keyspace, and (part two, in progress) the replication RPC, entry log and append path of
journals labelled `gazette.dev/replication-mode=quorum`. See docs/design/quorum.md."""
