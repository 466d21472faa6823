"""Filter pushdown: filters on the `journal` and `labels` columns prune the journals read.

Spark hands a batch reader the filters of a query that are ANDed together (pyspark's
`DataSourceReader.pushFilters`); those on the journal name (=, IN, LIKE 'prefix%', ends-with,
contains, and NOT of those) are decided per journal, exactly: a journal they exclude is not
read at all, and Spark does not evaluate them again. Filters on a label (a field of the
`labels` STRUCT column, e.g. `labels.region = 'eu'`) prune the journals no value of the label
could match, and are also left to Spark, which evaluates them on the column (a label with
several values reads as their values joined by ",").

Spark only pushes filters to Python data sources with spark.sql.python.filterPushdown.enabled
set, and refuses a reader that implements pushdown without it: so the reader implements it
only with option filterPushdown=true (source.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    In,
    IsNotNull,
    IsNull,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from spark_integration.rows import LABELS_COLUMN

Labels = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class JournalFilter:
    """A pushed filter, as a predicate of a journal (its name and labels). `exact`: it decides
    the column's value per journal exactly (Spark need not evaluate it again)."""

    test: Callable[[str, Labels | None], bool]
    exact: bool


def _value_test(f: Filter) -> Callable[[str | None], bool] | None:
    """A predicate of one string value, for the filters that have one."""
    if isinstance(f, EqualTo | EqualNullSafe):
        value = f.value
        return lambda v: v == value
    if isinstance(f, In):
        values = set(f.value)
        return lambda v: v in values
    if isinstance(f, StringStartsWith):
        prefix = f.value
        return lambda v: v is not None and v.startswith(prefix)
    if isinstance(f, StringEndsWith):
        suffix = f.value
        return lambda v: v is not None and v.endswith(suffix)
    if isinstance(f, StringContains):
        part = f.value
        return lambda v: v is not None and part in v
    if isinstance(f, IsNotNull):
        return lambda v: v is not None
    if isinstance(f, IsNull):
        return lambda v: v is None
    return None


def _label_values(labels: Labels | None, name: str) -> list[str]:
    return [v for n, v in labels or () if n == name]


def journal_filter(f: Filter) -> JournalFilter | None:
    """The JournalFilter of `f`, or None if it is not one this source takes."""
    negate = isinstance(f, Not)
    inner: Filter = f.child if isinstance(f, Not) else f
    attribute: tuple[str, ...] = tuple(getattr(inner, "attribute", ()))
    test = _value_test(inner)
    if test is None:
        return None
    if attribute == ("journal",):
        if negate:
            return JournalFilter(lambda name, labels: not test(name), exact=True)
        return JournalFilter(lambda name, labels: test(name), exact=True)
    if len(attribute) == 2 and attribute[0] == LABELS_COLUMN and not negate:
        label = attribute[1]

        def by_label(name: str, labels: Labels | None) -> bool:
            if labels is None:
                return True  # Unknown (store mode): keep the journal.
            values = _label_values(labels, label)
            joined = ",".join(values) if values else None
            # Any value, or the joined text Spark will see: never prune what could match.
            return test(joined) or any(test(v) for v in values)

        return JournalFilter(by_label, exact=False)
    return None


def push(filters: Iterable[Filter]) -> tuple[list[Filter], list[Filter]]:
    """The filters taken (kept by the reader, which must stay picklable: filters are), and
    those Spark must still evaluate (by reference, as given)."""
    taken: list[Filter] = []
    left: list[Filter] = []
    for f in filters:
        jf = journal_filter(f)
        if jf is not None:
            taken.append(f)
        if jf is None or not jf.exact:
            left.append(f)
    return taken, left


def keeps(filters: Sequence[Filter], name: str, labels: Labels | None) -> bool:
    """Whether a journal passes every taken filter."""
    for f in filters:
        jf = journal_filter(f)
        if jf is not None and not jf.test(name, labels):
            return False
    return True
