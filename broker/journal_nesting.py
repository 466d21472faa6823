"""Journals whose fragment files would mix in a store (sans-IO).

A store lists a journal's fragments as every file under `<store>/<journal>/`, the directories
between being a path postfix (Gazette lists stores the same way). A journal named under
another's name (`a/b` under `a`) that keeps its fragments in the same store therefore has its
files listed as the outer journal's, with postfix `b`: the outer journal's index takes them for
its own, covering its own fragments at the same offsets, and its reads return the inner
journal's bytes, which verify (each file is intact; found by an audit). So an Apply that would
make such a pair is refused (`nesting_conflict`), naming both journals and the store. A pair
that already exists (made by another tool) may still be edited, as long as the change does not
make it share a store it did not share before: refusing would only keep operators from moving
one of them away. What this does not see: a journal created under the name of one deleted
earlier whose files are still in the store (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple
from urllib.parse import urlsplit

from broker.protocol import protocol_pb2 as pb


class Nesting(NamedTuple):
    journal: str  # The upsert refused.
    other: str  # The journal it nests under, or that nests under it.
    store: str  # A store both keep fragments in.

    def describe(self) -> str:
        inner, outer = sorted((self.journal, self.other), key=len, reverse=True)
        return (
            f"journal {self.journal!r} and journal {self.other!r} would both keep fragments in"
            f" {self.store}, where {inner!r} is named under {outer!r}: a listing of"
            f" {outer!r}'s fragments would take {inner!r}'s files for its own (its reads"
            " would return the other journal's bytes); name them so that neither is the"
            " other's name followed by '/', or give them different fragment stores"
        )


def store_bases(spec: pb.JournalSpec) -> frozenset[str]:
    """The spec's fragment stores as the place their files go: without query parameters
    (which configure the client, not where files are), ending in '/'."""
    out = set()
    for url in spec.fragment.stores:
        parts = urlsplit(url)
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        out.add(f"{parts.scheme}://{parts.netloc}{path}")
    return frozenset(out)


def ancestors(name: str) -> Iterable[str]:
    """The names `name` is named under: `a` and `a/b` for `a/b/c`."""
    at = name.find("/")
    while at > 0:
        yield name[:at]
        at = name.find("/", at + 1)


def nesting_conflict(
    upserts: Mapping[str, pb.JournalSpec],
    deleted: AbstractSet[str],
    current: Callable[[str], pb.JournalSpec | None],
    named_under: Callable[[str], Iterable[pb.JournalSpec]],
) -> Nesting | None:
    """The first pair an Apply of `upserts` (by name) and `deleted` would newly make share a
    store while one is named under the other (see the module docstring), or None.
    `current(name)`: the spec the journal has now (None: none); `named_under(name)`: the
    current specs of the journals named under `name`."""

    def after(name: str) -> pb.JournalSpec | None:
        if name in upserts:
            return upserts[name]
        return None if name in deleted else current(name)

    for name, spec in upserts.items():
        stores = store_bases(spec)
        if not stores:
            continue
        related: dict[str, pb.JournalSpec] = {}
        for outer in ancestors(name):
            found = after(outer)
            if found is not None:
                related[outer] = found
        for inner in named_under(name):
            if inner.name not in upserts and inner.name not in deleted:
                related[inner.name] = inner
        prefix = name + "/"
        related.update({n: s for n, s in upserts.items() if n.startswith(prefix)})
        was = current(name)
        for other, other_spec in sorted(related.items()):
            shared = stores & store_bases(other_spec)
            if not shared:
                continue
            before = current(other)
            if was is not None and before is not None:
                if store_bases(was) & store_bases(before):
                    continue  # They shared a store before this change: not made by it.
            return Nesting(name, other, sorted(shared)[0])
    return None
