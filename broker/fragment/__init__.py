"""Fragments: content-addressed spans of a journal, and where they are kept.

- `naming`: fragment file names and store keys (Gazette-compatible), SHA1 sums.
- `codecs`: streaming compression of fragment files (NONE, GZIP, ZSTANDARD, SNAPPY).
- `cover_set`: the sans-IO index of fragments that reads are served from.
- `stores`: BLOB stores of fragment files (file://, s3://, memory://) and their conformance
  suite.

Submodules are imported explicitly (not re-exported here) so that using one does not pull in
the dependencies of all, e.g. boto3 for a reader of local fragments.
"""
