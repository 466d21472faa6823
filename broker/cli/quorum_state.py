"""The quorum state `gazctl journals list` shows for quorum journals (broker/quorum_states.py
gathers it, for the HTTP gateway too): here, its table cell."""

from __future__ import annotations

from typing import Any

from broker.quorum_states import quorum_states, state_of, status_timeout_s

__all__ = ["quorum_states", "state_of", "state_text", "status_timeout_s"]


def state_text(state: dict[str, Any]) -> str:
    """The table cell of a journal's quorum state."""
    if state["election"] == "leader":
        text = f"term {state['term']} leader {state['leader']}"
    elif state["election"] == "blocked":
        text = f"term {state['term']} ELECTION BLOCKED lost {','.join(state['blocked']['lost'])}"
    else:
        text = f"term {state['term']} electing"
    if state.get("kept"):
        text += f" kept {','.join(state['kept'])}"
    for member, why in state.get("failed", {}).items():
        text += f" FAILED {member}: {why}"
    for member, why in state.get("register_errors", {}).items():
        text += f" TERM REGISTER {member}: {why}"
    if state.get("unanswered"):
        text += f" (unanswered {','.join(state['unanswered'])})"
    return text
