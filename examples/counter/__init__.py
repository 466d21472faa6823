"""The counting example application: ``gazette-consumer serve --app examples.counter:Counter``.
See ``app.py`` and README.md."""

from examples.counter.app import COUNTS, Count, Counted, Counter, read_counts

__all__ = ["COUNTS", "Count", "Counted", "Counter", "read_counts"]
