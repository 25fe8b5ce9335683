"""The sans-IO parts of RocketMQ 5's gRPC protocol that read what a client sends: the
``authorization`` metadata (as the official client writes it, and anything else: refused with
AuthorizationError, never another exception), receipt handles and transaction ids (any text:
this gateway's own or None)."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from gateway.auth.access_keys import AccessKeys, date_signature
from protocols.rocketmq_grpc.authorization import AuthorizationError, parse_authorization
from protocols.rocketmq_grpc.receipts import Receipt, decode_receipt, decode_transaction_id, transaction_id


def official_metadata(access_key: str, secret: str, when: str) -> dict[str, str]:
    """rocketmq.v5.util.Signature.metadata's two signing entries."""
    sign = hmac.new(secret.encode(), when.encode(), hashlib.sha1).hexdigest()
    return {"x-mq-date-time": when, "authorization":
            f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={sign}"}


def test_the_official_clients_signature_is_read_and_verified() -> None:
    keys = AccessKeys({"AK1": ("secret-1", "alice")})
    signed = parse_authorization(official_metadata("AK1", "secret-1", "20261129T101500Z"))
    assert signed is not None and (signed.access_key, signed.date_time) == ("AK1", "20261129T101500Z")
    assert signed.signature == date_signature("20261129T101500Z", "secret-1")
    assert keys.verify_date(signed.access_key, signed.date_time, signed.signature) == ("alice", "")
    assert keys.verify_date("AK1", "20261129T101501Z", signed.signature)[0] is None  # (another time)
    assert keys.verify_date("AK1", signed.date_time, signed.signature.upper()) == ("alice", "")
    wrong = parse_authorization(official_metadata("AK1", "guess", "20261129T101500Z"))
    assert wrong is not None and keys.verify_date(wrong.access_key, wrong.date_time, wrong.signature)[0] is None
    unsigned = parse_authorization(official_metadata("", "", "20261129T101500Z"))  # (a client without keys)
    assert unsigned is not None and unsigned.access_key == ""
    assert parse_authorization({}) is None


@given(st.dictionaries(st.sampled_from(["authorization", "x-mq-date-time", "other"]), st.text(max_size=80)))
def test_any_metadata_is_read_or_refused(metadata: dict[str, str]) -> None:
    try:
        parse_authorization(metadata)
    except AuthorizationError:
        pass


@given(st.text(max_size=40) | st.text(max_size=20).map(lambda t: "x1 " + t)
       | st.text(max_size=20).map(lambda t: "t1 " + t))
def test_any_text_is_a_receipt_or_transaction_id_of_ours_or_none(text: str) -> None:
    receipt = decode_receipt(text)
    assert receipt is None or decode_receipt(receipt.encode()) == receipt
    position = decode_transaction_id(text)
    assert position is None or decode_transaction_id(transaction_id(position)) == position


def test_digits_that_are_not_ascii_are_no_token() -> None:
    assert decode_transaction_id("x1 \u00b2") is None and decode_receipt("t1 0 \u00b2 1") is None


@given(st.integers(0, (1 << 62) - 1), st.integers(0, 1 << 16), st.integers(0, (1 << 62) - 1))
def test_tokens_round_trip(offset: int, queue_id: int, due_ms: int) -> None:
    assert decode_receipt(Receipt(queue_id, offset, due_ms).encode()) == Receipt(queue_id, offset, due_ms)
    assert decode_transaction_id(transaction_id(offset)) == offset
