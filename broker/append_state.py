"""The append machine's states and the errors a run ends in (the machine: append_fsm.py, whose
docstring says what each state does and where it goes next)."""

from __future__ import annotations

import enum


class State(enum.Enum):
    RESOLVE = "resolve"
    ACQUIRE_PIPELINE = "acquire_pipeline"
    START_PIPELINE = "start_pipeline"
    SEND_PIPELINE_SYNC = "send_pipeline_sync"
    RECV_PIPELINE_SYNC = "recv_pipeline_sync"
    UPDATE_ASSIGNMENTS = "update_assignments"
    AWAIT_DESIRED_REPLICAS = "await_desired_replicas"
    VALIDATE_PRECONDITIONS = "validate_preconditions"
    UPDATE_SUSPEND = "update_suspend"
    STREAM_CONTENT = "stream_content"
    READ_ACKNOWLEDGEMENTS = "read_acknowledgements"
    ERROR = "error"
    PROXY = "proxy"
    FINISHED = "finished"


TERMINAL = frozenset({State.ERROR, State.PROXY, State.FINISHED})


class FSMStateError(AssertionError):
    """A handler was called in another state than its own: a bug."""


class AppendStreamError(Exception):
    """The client's stream broke the Append protocol, or ended without committing."""


class UnexpectedEOFError(AppendStreamError):
    def __init__(self) -> None:
        super().__init__("append stream ended without the empty commit chunk (rolled back)")


class ExpectedEOFError(AppendStreamError):
    def __init__(self) -> None:
        super().__init__("expected the end of the stream after the empty commit chunk")


class RegisterUpdateWithEmptyAppendError(AppendStreamError):
    def __init__(self) -> None:
        super().__init__("register updates require a non-empty append (rolled back)")


class ClientAbortedError(AppendStreamError):
    def __init__(self) -> None:
        super().__init__("append was cancelled by its client (rolled back)")


class IndexNotReadyError(Exception):
    """The journal's fragment index had no first store listing within the bound."""
