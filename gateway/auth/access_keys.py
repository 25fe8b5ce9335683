"""RocketMQ AccessKeys: the secret store the remoting listener checks request signatures with,
and the signature itself as RocketMQ's ACL plugin defines it (``AclClientRPCHook`` signs,
``PlainAccessValidator`` checks): the values of the request's ``extFields`` sorted by name,
``Signature`` left out, concatenated, UTF-8, then the body; HmacSHA1 with the SecretKey,
base64. The client sends ``AccessKey`` and ``Signature`` (and ``SecurityToken``, or ali-ons'
``OnsChannel``) among the ext fields, so they are signed too. RocketMQ 5's gRPC clients sign
with the same keys, the call's ``x-mq-date-time`` value only: HmacSHA1, hex
(``date_signature``).

The password file holds hashes, which cannot check an HMAC, so the secrets live in a file of
their own (``access_keys_file``), one key a line:

    # AccessKey  SecretKey  [user]
    rocketmq2    12345678   alice

The user (default: the AccessKey) is the principal the ACL's ``user`` sections name. The file
holds secrets in the clear: keep it readable by the gateway only (a warning says so otherwise).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .passwords import AuthConfigError

log = logging.getLogger("tidemq.auth")

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"


def _java_order(name: str) -> bytes:
    return name.encode("utf-16-be")  # Java's TreeMap orders strings by UTF-16 code units


def signature(ext_fields: dict[str, str], body: bytes, secret_key: str) -> str:
    content = "".join(value for name, value in sorted(ext_fields.items(), key=lambda item: _java_order(item[0]))
                      if name != SIGNATURE)
    digest = hmac.new(secret_key.encode(), content.encode() + (body or b""), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def date_signature(date_time: str, secret_key: str) -> str:
    """RocketMQ 5's gRPC signature of a call stamped ``date_time``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class AccessKeys:
    def __init__(self, keys: dict[str, tuple[str, str]] | None = None) -> None:
        self._keys = dict(keys or {})  # AccessKey -> (SecretKey, user)

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AccessKeys:
        try:
            text = Path(path).read_text(encoding="utf-8")
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise AuthConfigError(f"cannot read access keys file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise AuthConfigError(f"access keys file {path} is not UTF-8") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("access keys file readable by others path=%s mode=%o (chmod 600)", path, mode & 0o777)
        keys: dict[str, tuple[str, str]] = {}
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) not in (2, 3):
                raise AuthConfigError(f"{path}:{number}: expected: ACCESS_KEY SECRET_KEY [USER]")
            if words[0] in keys:
                raise AuthConfigError(f"{path}:{number}: AccessKey {words[0]!r} is listed twice")
            keys[words[0]] = (words[1], words[2] if len(words) == 3 else words[0])
        return cls(keys)

    def verify(self, ext_fields: dict[str, str], body: bytes) -> tuple[str | None, str]:
        """(the user the request is signed for, "") or (None, why not)."""
        return self._check(ext_fields.get(ACCESS_KEY, ""), ext_fields.get(SIGNATURE) or "",
                           lambda secret: signature(ext_fields, body, secret))

    def verify_date(self, access_key: str, date_time: str, given: str) -> tuple[str | None, str]:
        """``verify`` for a gRPC call: its signature ``given`` of its ``date_time``."""
        return self._check(access_key, given.lower(), lambda secret: date_signature(date_time, secret))

    def _check(self, access_key: str, given: str, sign: Callable[[str], str]) -> tuple[str | None, str]:
        entry = self._keys.get(access_key)
        if entry is None:
            return None, f"unknown AccessKey {access_key!r}"
        if not given:
            return None, "the request has an AccessKey but no Signature"
        if not hmac.compare_digest(sign(entry[0]).encode(), given.encode()):
            return None, "the signature does not match the request (check the SecretKey)"
        return entry[1], ""
