"""The opaque tokens this gateway hands gRPC clients: receipt handles, what a received
message's ack (or change of invisible time) names it by -- its queue, its offset there and its
check point's due time; and transaction ids, what a transaction's end names its half message
by -- where it is stored."""

from __future__ import annotations

from dataclasses import dataclass

VERSION = "t1"


@dataclass(slots=True, frozen=True)
class Receipt:
    queue_id: int
    offset: int
    due_ms: int  # when its check point is due: the pop's time plus its invisible duration

    def encode(self) -> str:
        return f"{VERSION} {self.queue_id} {self.offset} {self.due_ms}"


def decode_receipt(text: str) -> Receipt | None:
    """The receipt ``text`` names; None when it is none of this gateway's."""
    parts = text.split(" ")
    if len(parts) != 4 or parts[0] != VERSION:
        return None
    try:
        queue_id, offset, due_ms = (int(p) for p in parts[1:])
    except ValueError:
        return None
    if queue_id < 0 or offset < 0 or due_ms < 0 or max(offset, due_ms) >= 1 << 62:
        return None
    return Receipt(queue_id, offset, due_ms)


TRANSACTION_VERSION = "x1"


def transaction_id(position: int) -> str:
    """The transaction id of the half message stored at ``position``."""
    return f"{TRANSACTION_VERSION} {position}"


def decode_transaction_id(text: str) -> int | None:
    """The position a transaction id names; None when it is none of this gateway's."""
    version, _, position = text.partition(" ")
    if version != TRANSACTION_VERSION or not (position.isascii() and position.isdigit()) or len(position) > 19:
        return None
    value = int(position)
    return value if value < 1 << 62 else None
