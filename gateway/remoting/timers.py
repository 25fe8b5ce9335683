"""Timer messages of RocketMQ clients: a delivery time given by a property (RocketMQ 5's
``TIMER_DELAY_SEC``, ``TIMER_DELAY_MS``, ``TIMER_DELIVER_MS``, in that order of precedence as
its broker reads them, or ONS's ``__STARTDELIVERTIME``), stored at once and delivered then by
the gateway's one timer (core/timer.py). A time already past is no delay, as RocketMQ; a value
that is not a number answers MESSAGE_ILLEGAL, as RocketMQ's "timer message illegal"."""

from __future__ import annotations

from protocols.remoting.codes import ResponseCode
from protocols.remoting.properties import (
    DELAY,
    START_DELIVER_TIME,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
)

from .requests import BadRequest

TIMER_PROPERTIES = (TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_DELIVER_MS, START_DELIVER_TIME)


def timer_due_ms(properties: dict[str, str], now_ms: int) -> int | None:
    """The due time (ms) a message's properties ask for, or None: deliver now. Sets
    ``TIMER_OUT_MS`` (what RocketMQ's consumers see) when there is one. Any delay is taken
    (RocketMQ's broker caps it at timerMaxDelaySec, 3 days by default; the store has no wheel
    to outgrow, store/holds/codec.py)."""
    name = next((n for n in TIMER_PROPERTIES if n in properties), None)
    if name is None:
        return None
    if DELAY in properties:
        raise BadRequest("a message has a delay level (DELAY) or a delivery time (" + name + "), not both",
                         ResponseCode.MESSAGE_ILLEGAL)
    try:
        value = int(properties[name].strip())
    except ValueError:
        raise BadRequest(f"timer message illegal: {name}={properties[name]!r} is not a number",
                         ResponseCode.MESSAGE_ILLEGAL) from None
    due = now_ms + value * 1000 if name == TIMER_DELAY_SEC else now_ms + value if name == TIMER_DELAY_MS else value
    if due <= now_ms:
        return None
    properties[TIMER_OUT_MS] = str(due)
    return due
