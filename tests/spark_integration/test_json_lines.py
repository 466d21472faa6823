"""JSONLinesDecoder across an offset jump (content skipped as lost, failOnDataLoss=false): the
whole lines before the jump are still messages; only a line the jump cut is dropped."""

from __future__ import annotations

import json

from spark_integration.json_lines import JSONLinesDecoder
from tests.spark_integration.spark_testkit import OUTSIDE, Msg, producer


def texts(batches) -> list[str]:  # type: ignore[no-untyped-def]
    return [json.loads(line)["text"] for b in batches for line in b.content.to_pylist()]


def test_a_jump_keeps_the_whole_lines_before_it_and_drops_a_cut_line() -> None:
    p = producer()
    a, b, c = (Msg(p, 100 + i, OUTSIDE, {"text": t}).line() for i, t in enumerate("abc"))
    decoder = JSONLinesDecoder("j", 0)
    out = decoder.feed(a, 0)  # A whole line, buffered (below a piece).
    out += decoder.feed(b[:10], len(a))  # The start of a line the jump will cut.
    jump = len(a) + 1000
    out += decoder.feed(c, jump)
    out += decoder.flush()
    assert texts(out) == ["a", "c"]
    assert [o for batch in out for o in batch.begins.tolist()] == [0, jump]
