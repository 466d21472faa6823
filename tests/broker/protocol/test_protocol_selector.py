"""Label-selector strings: Gazette's grammar, canonical formatting and matching semantics."""

from __future__ import annotations

import pickle
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.selector import SelectorError, format_selector, matches, parse_selector
from broker.protocol.validate import ValidationError


def _sel(
    include: Iterable[tuple[str, str]] = (), exclude: Iterable[tuple[str, str]] = ()
) -> pb.LabelSelector:
    return pb.LabelSelector(include=label_set(include), exclude=label_set(exclude))


# Cases from Gazette's own parser tests, plus prefix forms and spacing variants.
PARSE_CASES: list[tuple[str, pb.LabelSelector, str]] = [
    ("foo = bar", _sel([("foo", "bar")]), "foo=bar"),
    ("foo != bar", _sel(exclude=[("foo", "bar")]), "foo!=bar"),
    ("foo ", _sel([("foo", "")]), "foo"),
    (" !foo", _sel(exclude=[("foo", "")]), "!foo"),
    (" foo in (bing, baz,bar)", _sel([("foo", "bar"), ("foo", "baz"), ("foo", "bing")]), "foo in (bar,baz,bing)"),
    (" foo not in ( pear, apple )", _sel(exclude=[("foo", "apple"), ("foo", "pear")]), "foo notin (apple,pear)"),
    ("foo==bar, baz !=bing ,apple in (fruit, banana)",
     _sel([("apple", "banana"), ("apple", "fruit"), ("foo", "bar")], [("baz", "bing")]),
     "apple in (banana,fruit),foo=bar,baz!=bing"),
    ("!foo,baz,bing not in (thing-one, thing-2),!bar,",
     _sel([("baz", "")], [("bar", ""), ("bing", "thing-2"), ("bing", "thing-one"), ("foo", "")]),
     "baz,!bar,bing notin (thing-2,thing-one),!foo"),
    # Values may contain '=' and '%' (path symbols); names may not.
    ("foo = ba=ar, baz=bi=ngo,exc!=who=ops",
     _sel([("baz", "bi=ngo"), ("foo", "ba=ar")], [("exc", "who=ops")]),
     "baz=bi=ngo,foo=ba=ar,exc!=who=ops"),
    ("foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
     _sel([("foo", "ba=ar"), ("foo", "bi=ng")], [("exc", "oth=er"), ("exc", "who=ops")]),
     "foo in (ba=ar,bi=ng),exc notin (oth=er,who=ops)"),
    ("topic in (topic/one, topic/two), prefix=/my/journal/prefix",
     _sel([("prefix", "/my/journal/prefix"), ("topic", "topic/one"), ("topic", "topic/two")]),
     "prefix=/my/journal/prefix,topic in (topic/one,topic/two)"),
    ("ab=c%2Fd", _sel([("ab", "c%2Fd")]), "ab=c%2Fd"),
    ("", _sel(), ""),
    ("  ", _sel(), ""),
    ("xx=1", _sel([("xx", "1")]), "xx=1"),  # One-character values parse.
    ("\tfoo\t=\tbar ,\n!baz", _sel([("foo", "bar")], [("baz", "")]), "foo=bar,!baz"),
    ("foo in (a,b,)", _sel([("foo", "a"), ("foo", "b")]), "foo in (a,b)"),
    ("日本=語", _sel([("日本", "語")]), "日本=語"),
    # "==" is "=": a value beginning with '=' formats in set form to stay unambiguous.
    ("aa===b", _sel([("aa", "=b")]), "aa in (=b)"),
    ("aa!==b", _sel(exclude=[("aa", "=b")]), "aa!==b"),
]  # fmt: skip


def _prefix_sel(
    include: Iterable[tuple[str, str, bool]] = (), exclude: Iterable[tuple[str, str, bool]] = ()
) -> pb.LabelSelector:
    def build(labels: Iterable[tuple[str, str, bool]]) -> pb.LabelSet:
        return pb.LabelSet(labels=[pb.Label(name=n, value=v, prefix=p) for n, v, p in labels])

    return pb.LabelSelector(include=build(include), exclude=build(exclude))


PREFIX_CASES: list[tuple[str, pb.LabelSelector, str]] = [
    ("name:prefix=a/b/", _prefix_sel([("name", "a/b/", True)]), "name:prefix=a/b/"),
    ("team:prefix != x/", _prefix_sel(exclude=[("team", "x/", True)]), "team:prefix!=x/"),
    ("team:prefix in (x/, y/)", _prefix_sel([("team", "x/", True), ("team", "y/", True)]), "team:prefix in (x/,y/)"),
    ("team:prefix notin (y/,x/)", _prefix_sel(exclude=[("team", "x/", True), ("team", "y/", True)]), "team:prefix notin (x/,y/)"),
    # Exact and prefix values of one name interleave in (name, value) order.
    ("team in (b, d), team:prefix in (a, c)",
     _prefix_sel([("team", "a", True), ("team", "b", False), ("team", "c", True), ("team", "d", False)]),
     "team in (b,d),team:prefix in (a,c)"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expect", "canonical"), PARSE_CASES + PREFIX_CASES)
def test_parse_and_format(text: str, expect: pb.LabelSelector, canonical: str) -> None:
    selector = parse_selector(text)
    assert selector == expect
    assert format_selector(selector) == canonical
    assert parse_selector(canonical) == selector


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        # Gazette's own error cases.
        ("apple,banana err in (bar)", "expected '=', '==', '!=', 'in', 'notin', ',' or end of selector at offset 13 (got 'err in (bar)')", 13),
        ("apple,banana in (bar,err baz)", "expected ',' or ')' at offset 25 (got 'baz)')", 25),
        ("ban=ana in (bar)", "expected ',' or end of selector at offset 8 (got 'in (bar)')", 8),
        # Shapes that are not terms.
        (",a", "expected a label name at offset 0 (got ',a')", 0),
        ("a,,b", "expected a label name at offset 2 (got ',b')", 2),
        ("foo=", "expected a label value at offset 4 (got end of selector)", 4),
        ("foo!=", "expected a label value at offset 5 (got end of selector)", 5),
        ("!", "expected a label name at offset 1 (got end of selector)", 1),
        ("foo in", "expected '(' at offset 6 (got end of selector)", 6),
        ("foo in (a", "expected ',' or ')' at offset 9 (got end of selector)", 9),
        ("foo in ()", "expected a label value at offset 8 (got ')')", 8),
        ("foo not (a)", "expected 'in' after 'not' at offset 8 (got '(a)')", 8),
        ("foo:prefix", "expected '=', '!=', 'in' or 'notin' after ':prefix' at offset 10 (got end of selector)", 10),
        ("foo:prefix,bar", "expected '=', '!=', 'in' or 'notin' after ':prefix' at offset 10 (got ',bar')", 10),
        ("!foo:prefix", "expected ',' or end of selector at offset 4 (got ':prefix')", 4),
        ("foo:bar=x", "expected '=', '==', '!=', 'in', 'notin', ',' or end of selector at offset 3 (got ':bar=x')", 3),
        ("foo=bar baz", "expected ',' or end of selector at offset 8 (got 'baz')", 8),
        ("foo=a b c d e f g h i j k l", "expected ',' or end of selector at offset 6 (got 'b c d e f g h i ...')", 6),
        ("x|y", "expected '=', '==', '!=', 'in', 'notin', ',' or end of selector at offset 1 (got '|y')", 1),
        ("fooin(a)", "expected '=', '==', '!=', 'in', 'notin', ',' or end of selector at offset 5 (got '(a)')", 5),
    ],
)  # fmt: skip
def test_parse_errors_name_position_and_expectation(text: str, message: str, position: int) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert str(info.value) == message
    assert info.value.position == position


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Parsed, then validated as Gazette does: the path names the offending label.
        ("foo, foo in (bar)", 'include.labels[1]: must not mix the empty value with non-empty values of one name (got "foo"="bar" after "foo"="")'),
        ("foo=bar,foo=bar", 'include.labels[1]: must be in unique, sorted order over (name, value) (got "foo"="bar" after "foo"="bar")'),
        ("a=b", 'include.labels[0].name: length must be in [2, 64] bytes (got 1: "a")'),
        ("aa,!" + "n" * 65, 'exclude.labels[0].name: length must be in [2, 64] bytes (got 65: "' + "n" * 65 + '")'),
    ],
)  # fmt: skip
def test_parsed_selector_is_validated(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert isinstance(info.value, ValidationError)
    assert str(info.value) == message
    assert info.value.position is None


def test_prefix_with_empty_value_formats_as_existence() -> None:
    selector = _prefix_sel([("aa", "", True)], [("bb", "", True)])
    assert format_selector(selector) == "aa,!bb"


# --- Matching -----------------------------------------------------------------------------------

_GAZETTE_SELECTOR = _sel(
    [("inc-1", "a-val"), ("inc-2", ""), ("inc-3", "val-1"), ("inc-3", "val-2")],
    [("exc-1", ""), ("exc-2", "val-3"), ("exc-2", "val-4")],
)


@pytest.mark.parametrize(
    ("pairs", "expect"),
    [
        ([], False),
        ([("foo", "bar"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-1")], True),
        ([("foo", "bar"), ("inc-1", "a-val"), ("inc-2", "foo"), ("inc-3", "val-1")], True),
        ([("foo", "bar"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-2")], True),
        ([("foo", "bar"), ("inc-1", "bad-val"), ("inc-2", "any"), ("inc-3", "val-1")], False),
        ([("foo", "bar"), ("inc-1", "a-val"), ("inc-3", "val-1")], False),
        ([("foo", "bar"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-other")], False),
        ([("exc-1", "any"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-1")], False),
        ([("exc-2", "val-4"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-1")], False),
        ([("exc-2", "val-ok"), ("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-1")], True),
        # A multi-valued label matches if any of its values does.
        ([("inc-1", "a-val"), ("inc-1", "zzz"), ("inc-2", "x"), ("inc-3", "val-0"), ("inc-3", "val-2")], True),
    ],
)  # fmt: skip
def test_matching_cases(pairs: list[tuple[str, str]], expect: bool) -> None:
    assert matches(_GAZETTE_SELECTOR, label_set(pairs)) is expect


def test_exclude_only_selector() -> None:
    selector = _sel(exclude=[("exc-1", ""), ("exc-2", "val-3")])
    assert matches(selector, label_set())
    assert matches(selector, label_set([("foo", "bar")]))
    assert matches(selector, label_set([("exc-2", "val-ok")]))
    assert not matches(selector, label_set([("exc-2", "val-3")]))
    assert not matches(selector, label_set([("exc-1", "any")]))
    assert matches(_sel(), label_set([("anything", "x")]))


@pytest.mark.parametrize(
    ("text", "pairs", "expect"),
    [
        ("name:prefix=a/b/", [("name", "a/b/c")], True),
        ("name:prefix=a/b/", [("name", "a/b/")], True),
        ("name:prefix=a/b/", [("name", "a/bc")], False),
        ("name:prefix=a/b", [("name", "a/bc")], True),
        ("name:prefix=a/b/", [], False),
        ("team:prefix in (x/, y/)", [("team", "y/1")], True),
        ("team:prefix in (x/, y/)", [("team", "z/1")], False),
        ("team:prefix!=x/", [("team", "x/1")], False),
        ("team:prefix!=x/", [("team", "y/1")], True),
        ("team:prefix!=x/", [], True),
        ("team in (b), team:prefix in (a)", [("team", "b")], True),
        ("team in (b), team:prefix in (a)", [("team", "ab")], True),
        ("team in (b), team:prefix in (a)", [("team", "ba")], False),
    ],
)
def test_prefix_matching(text: str, pairs: list[tuple[str, str]], expect: bool) -> None:
    assert matches(parse_selector(text), label_set(pairs)) is expect


# --- Properties -------------------------------------------------------------------------------------

_NAMES = st.text(alphabet="ab/._-+Z9é", min_size=2, max_size=4)
# Values never contain 'Q', so "Q" is a value that matches no selector value.
_VALUES = st.text(alphabet="ab/=%.x9", min_size=1, max_size=5)
_SUFFIXES = st.text(alphabet="ab/=%.x9", max_size=3)


@st.composite
def _groups(draw: st.DrawFn, names: list[str]) -> list[pb.Label]:
    out: list[pb.Label] = []
    for name in names:
        if draw(st.booleans()):
            out.append(pb.Label(name=name))  # Existence.
            continue
        values = draw(st.lists(_VALUES, min_size=1, max_size=3, unique=True))
        out.extend(pb.Label(name=name, value=v, prefix=draw(st.booleans())) for v in values)
    return sorted(out, key=lambda label: (label.name, label.value))


@st.composite
def _selectors(draw: st.DrawFn, disjoint: bool = False) -> pb.LabelSelector:
    if disjoint:
        names = draw(st.lists(_NAMES, unique=True, max_size=6))
        split = draw(st.integers(0, len(names)))
        include, exclude = names[:split], names[split:]
    else:
        include = draw(st.lists(_NAMES, unique=True, max_size=4))
        exclude = draw(st.lists(_NAMES, unique=True, max_size=4))
    return pb.LabelSelector(
        include=pb.LabelSet(labels=draw(_groups(include))),
        exclude=pb.LabelSet(labels=draw(_groups(exclude))),
    )


@settings(max_examples=200)
@given(_selectors())
def test_parse_of_format_is_identity(selector: pb.LabelSelector) -> None:
    text = format_selector(selector)
    assert parse_selector(text) == selector
    assert format_selector(parse_selector(text)) == text


@settings(max_examples=200)
@given(st.text(alphabet="ab=!,() :prefixnotin\t%/", max_size=30))
def test_parse_never_fails_untyped(text: str) -> None:
    try:
        selector = parse_selector(text)
    except SelectorError:
        return
    # Whatever parses is canonical after one round.
    assert parse_selector(format_selector(selector)) == selector


def _satisfying_pairs(data: st.DataObject, selector: pb.LabelSelector) -> list[tuple[str, str]]:
    draw = data.draw
    pairs: list[tuple[str, str]] = []
    by_name: dict[str, list[pb.Label]] = {}
    for label in selector.include.labels:
        by_name.setdefault(label.name, []).append(label)
    for name, group in by_name.items():
        chosen = draw(st.sampled_from(group))
        if chosen.value == "":
            pairs.append((name, draw(_VALUES)))
        else:
            pairs.append((name, chosen.value + (draw(_SUFFIXES) if chosen.prefix else "")))
    # Unrelated labels never change the outcome.
    used = {label.name for label in selector.include.labels} | {
        label.name for label in selector.exclude.labels
    }
    extra = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=3))
    pairs += [(n, v) for n, v in extra if n not in used]
    return pairs


@settings(max_examples=200)
@given(st.data(), _selectors(disjoint=True))
def test_built_label_set_matches_and_flips(data: st.DataObject, selector: pb.LabelSelector) -> None:
    pairs = _satisfying_pairs(data, selector)
    assert matches(selector, label_set(pairs))

    include_names = sorted({label.name for label in selector.include.labels})
    if include_names:
        # Drop one required label: no longer selected.
        victim = data.draw(st.sampled_from(include_names))
        assert not matches(selector, label_set([p for p in pairs if p[0] != victim]))
        # Or give it a value none of the selector's values match (unless any value will do).
        if any(label.value for label in selector.include.labels if label.name == victim):
            flipped = [(n, "Q" if n == victim else v) for n, v in pairs]
            assert not matches(selector, label_set(flipped))

    if selector.exclude.labels:
        # Add a label an exclusion matches: no longer selected.
        hit = data.draw(st.sampled_from(list(selector.exclude.labels)))
        value = hit.value + (data.draw(_SUFFIXES) if hit.prefix else "") if hit.value else "any"
        assert not matches(selector, label_set([*pairs, (hit.name, value)]))


def test_selector_error_survives_pickling() -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector("foo in")
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is SelectorError
    assert copy.position == 6
    assert str(copy) == str(info.value)
