"""The replication-mode label (`gazette.dev/replication-mode`): validated at the spec boundary,
absent meaning Gazette's all-replicas mode."""

from __future__ import annotations

import pytest

from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.validate import ValidationError, validate_journal_spec
from broker.quorum_shell.dispatch import QuorumModeNotServedError, quorum_mode_refusal


def _spec(*labels: tuple[str, str]) -> pb.JournalSpec:
    spec = pb.JournalSpec(name="a/journal", replication=3, labels=label_set(labels))
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.refresh_interval.seconds = 60
    return spec


@pytest.mark.parametrize("mode", ["all-replicas", "quorum"])
def test_known_modes_are_accepted(mode: str) -> None:
    spec = _spec(("content-type", "application/x-ndjson"), (gl.REPLICATION_MODE, mode))
    validate_journal_spec(spec)
    assert gl.is_quorum_journal(spec.labels) == (mode == "quorum")


def test_absent_label_is_all_replicas() -> None:
    spec = _spec(("content-type", "application/x-ndjson"))
    validate_journal_spec(spec)
    assert not gl.is_quorum_journal(spec.labels)


@pytest.mark.parametrize("value", ["", "Quorum", "majority", "all"])
def test_unknown_mode_is_refused_naming_the_label(value: str) -> None:
    spec = _spec(("aa", "x"), (gl.REPLICATION_MODE, value))
    with pytest.raises(ValidationError) as info:
        validate_journal_spec(spec)
    assert str(info.value) == (
        'labels.labels[1].value: label "gazette.dev/replication-mode" must be one of '
        f'"all-replicas", "quorum" (got "{value}")'
    )


def test_mode_is_single_valued() -> None:
    spec = _spec((gl.REPLICATION_MODE, "all-replicas"), (gl.REPLICATION_MODE, "quorum"))
    with pytest.raises(ValidationError) as info:
        validate_journal_spec(spec)
    assert str(info.value) == (
        'labels.labels[1]: label "gazette.dev/replication-mode" may have only one value'
        ' (got "quorum" after "all-replicas")'
    )


def test_without_a_quorum_shell_quorum_appends_are_refused_naming_the_label() -> None:
    quorum = _spec((gl.REPLICATION_MODE, "quorum"))
    error = quorum_mode_refusal("a/journal", quorum)
    assert isinstance(error, QuorumModeNotServedError)
    assert "gazette.dev/replication-mode=quorum" in str(error)
    assert quorum_mode_refusal("a/journal", _spec((gl.REPLICATION_MODE, "all-replicas"))) is None
    assert quorum_mode_refusal("a/journal", _spec()) is None
    assert quorum_mode_refusal("a/journal", None) is None
