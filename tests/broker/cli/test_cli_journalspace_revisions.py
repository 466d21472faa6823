"""Journal spaces with Gazette's per-journal ``revision``: written by `journal_space_doc` (what
``journals edit`` opens), read back by `parse_journal_changes`, and honoured by ``journals
apply`` against a broker (a stale revision refuses the whole apply)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker import client
from broker.cli import gazctl
from broker.cli.journalspace import journal_space_doc, parse_journal_changes, parse_journal_space
from tests.broker.broker_testkit import Cluster, journal_spec


def test_journal_space_doc_round_trips_specs_and_revisions() -> None:
    listing = [(journal_spec("a/x/one", replication=2), 11), (journal_spec("a/y/two"), 12)]
    doc = journal_space_doc(listing)
    assert doc["name"] == "a/"
    changes = parse_journal_changes(yaml.safe_dump(doc))
    assert [(c.spec, c.name, c.revision) for c in changes] == [
        (listing[0][0], "a/x/one", 11),
        (listing[1][0], "a/y/two", 12),
    ]
    # Journals sharing no prefix: Gazette's root of an empty name.
    doc = journal_space_doc([(journal_spec("one/j"), 1), (journal_spec("two/j"), 2)])
    assert doc["name"] == ""
    assert [c.name for c in parse_journal_changes(yaml.safe_dump(doc))] == ["one/j", "two/j"]
    # A shared prefix that is not a directory is not a directory name.
    assert journal_space_doc([(journal_spec("ab/j"), 1), (journal_spec("ac/j"), 2)])["name"] == ""


def test_revisions_are_optional_and_leave_the_pairs_api_alone() -> None:
    text = "name: a/\nchildren:\n- {name: a/one, replication: 1, revision: 5}\n- {name: a/two}\n"
    base = "fragment: {length: 4096, compression_codec: NONE, refresh_interval: 30s}\n"
    text = text.replace("name: a/\n", "name: a/\nreplication: 1\n" + base, 1)
    assert [(c.name, c.revision) for c in parse_journal_changes(text)] == [
        ("a/one", 5),
        ("a/two", None),
    ]
    assert [name for _, name in parse_journal_space(text)] == ["a/one", "a/two"]


async def test_journals_apply_honours_revisions(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec("rev/one"), [b])
    c = client.JournalClient(b.endpoint)
    try:
        (listed,) = (await client.list_journals(c, "name=rev/one")).journals
        current = listed.mod_revision
        space = tmp_path / "space.yaml"
        doc = journal_space_doc([(listed.spec, current + 100)])  # Not the current revision.
        doc["children"][0]["replication"] = 3
        space.write_text(yaml.safe_dump(doc))
        argv = ["--broker", b.endpoint, "journals", "apply", "-f", str(space)]
        assert await gazctl.run(gazctl.parse_args(argv)) == 1
        assert "ETCD_TRANSACTION_FAILED" in capsys.readouterr().err
        doc["children"][0]["revision"] = current
        space.write_text(yaml.safe_dump(doc))
        assert await gazctl.run(gazctl.parse_args(argv)) == 0
        (after,) = (await client.list_journals(c, "name=rev/one")).journals
        assert after.spec.replication == 3
    finally:
        await c.channels.close()
