"""RocketMQ 5's request signature: the ``authorization`` metadata of a gRPC call, as the
official clients write it (``MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time,
Signature=HEX``), parsed into its parts. The signature itself is checked where the secrets
are (gateway/auth/access_keys.py)."""

from __future__ import annotations

from dataclasses import dataclass

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"  # the one header the clients sign
ALGORITHM = "MQv2-HMAC-SHA1"


class AuthorizationError(ValueError):
    """An ``authorization`` value that is not RocketMQ 5's signature."""


@dataclass(slots=True, frozen=True)
class Authorization:
    access_key: str  # "" when the client has no credentials
    signature: str  # hex HMAC-SHA1 of the x-mq-date-time value
    date_time: str  # the signed x-mq-date-time value


def parse_authorization(metadata: dict[str, str]) -> Authorization | None:
    """The signature a call's ``metadata`` carries; None when it carries none."""
    text = metadata.get(AUTHORIZATION)
    if text is None:
        return None
    algorithm, _, rest = text.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthorizationError(f"the authorization is not {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals:
            raise AuthorizationError(f"the authorization field {name!r} has no value")
        fields[name] = value.strip()
    signed = {h.strip().lower() for h in fields.get("SignedHeaders", "").split(";") if h.strip()}
    if signed != {DATE_TIME}:
        raise AuthorizationError(f"SignedHeaders must be {DATE_TIME}")
    date_time = metadata.get(DATE_TIME, "")
    if not date_time:
        raise AuthorizationError(f"the signed {DATE_TIME} header is missing")
    return Authorization(fields.get("Credential", ""), fields.get("Signature", ""), date_time)
