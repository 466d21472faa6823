"""Gazette messages: UUIDs and clocks, the Message interface, framings, mappings, Publisher.

Importing this package registers the built-in framings under their content types, as Gazette's
Go ``message`` package does on import.
"""

from gazette_consumer.message.clock import Clock, ClockError
from gazette_consumer.message.csv_framing import CSVFrameable, CSVFraming, CSVRecord
from gazette_consumer.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_LABEL,
    CONTENT_TYPE_PROTO_FIXED,
    MESSAGE_BYTES_MAX_DEFAULT,
    Decoder,
    FeedOffsetError,
    Frame,
    FrameDesyncError,
    FrameRun,
    FrameTooLargeError,
    Framing,
    FramingError,
    MessageDecodeError,
    MessageEncodeError,
    MessageTooLargeError,
    TruncatedFrameError,
    UnknownContentTypeError,
    Unpacker,
    UnpackEvent,
    decode_envelope,
    framing_for_content_type,
    register_framing,
)
from gazette_consumer.message.json_framing import JSONFraming, JSONMessage
from gazette_consumer.message.mapping import (
    EmptyPartitionsError,
    Partition,
    Partitions,
    PartitionsWatch,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette_consumer.message.message import (
    Envelope,
    EnvelopeBuilder,
    InvalidEnvelopeError,
    Message,
    message_uuid,
)
from gazette_consumer.message.protobuf_framing import FixedFraming
from gazette_consumer.message.publisher import (
    InvalidMessageError,
    Publisher,
    UnfinishedPublishError,
    write_ack_intents,
)
from gazette_consumer.message.uuid import (
    NIL_UUID,
    Flag,
    InvalidUUIDError,
    ProducerID,
    UUIDParts,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    parse_uuid,
)

for _framing in (JSONFraming, FixedFraming, CSVFraming):
    register_framing(_framing)

__all__ = [
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_LABEL",
    "CONTENT_TYPE_PROTO_FIXED",
    "MESSAGE_BYTES_MAX_DEFAULT",
    "NIL_UUID",
    "CSVFrameable",
    "CSVFraming",
    "CSVRecord",
    "Clock",
    "ClockError",
    "Decoder",
    "EmptyPartitionsError",
    "Envelope",
    "EnvelopeBuilder",
    "FeedOffsetError",
    "FixedFraming",
    "Flag",
    "Frame",
    "FrameDesyncError",
    "FrameRun",
    "FrameTooLargeError",
    "Framing",
    "FramingError",
    "InvalidEnvelopeError",
    "InvalidMessageError",
    "InvalidUUIDError",
    "JSONFraming",
    "JSONMessage",
    "Message",
    "MessageDecodeError",
    "MessageEncodeError",
    "MessageTooLargeError",
    "Partition",
    "Partitions",
    "PartitionsWatch",
    "ProducerID",
    "Publisher",
    "TruncatedFrameError",
    "UUIDParts",
    "UnfinishedPublishError",
    "UnknownContentTypeError",
    "UnpackEvent",
    "Unpacker",
    "build_uuid",
    "decode_envelope",
    "framing_for_content_type",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "message_uuid",
    "modulo_mapping",
    "new_producer_id",
    "parse_uuid",
    "random_mapping",
    "register_framing",
    "rendezvous_mapping",
    "write_ack_intents",
]
