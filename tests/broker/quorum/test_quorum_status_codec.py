"""The quorum Status answer's codec and the state gazctl shows from it (sans-IO): a member's
term register error goes through, and is left out of both when there is none."""

from __future__ import annotations

import json

from broker.cli.quorum_state import state_of, state_text
from broker.quorum_shell.status import JournalStatus, decode_response, encode_response

WHY = "NoSpaceError: etcd is out of space (mvcc: database space exceeded)"
ENSEMBLE = ("zone-a#b1", "zone-a#b2", "zone-b#b3")


def member(name: str, register_error: str = "") -> JournalStatus:
    return JournalStatus(
        "q/j", 3, "zone-a#b1", ENSEMBLE, member=name, register_error=register_error
    )


def test_a_register_error_goes_through_the_answer_and_into_the_listing() -> None:
    statuses = [member("zone-a#b2", WHY), member("zone-b#b3")]
    raw = encode_response(statuses)
    docs = json.loads(raw)["journals"]
    assert docs[0]["register_error"] == WHY and "register_error" not in docs[1]
    decoded = decode_response(raw)
    assert decoded["q/j"] == statuses[-1]  # by journal: the last answer of it
    assert [decode_response(encode_response([s]))["q/j"] for s in statuses] == statuses

    state = state_of(statuses[0], statuses, [])
    assert state["register_errors"] == {"zone-a#b2": WHY}
    assert f"TERM REGISTER zone-a#b2: {WHY}" in state_text(state)

    clean = state_of(statuses[1], [statuses[1]], [])
    assert "register_errors" not in clean and "TERM REGISTER" not in state_text(clean)
