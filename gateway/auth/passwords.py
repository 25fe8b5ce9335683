"""The password file, in Mosquitto's format so existing files work: one ``user:hash`` line per
user; ``$7$iterations$salt$hash`` (PBKDF2-HMAC-SHA512, what we write) or ``$6$salt$hash``
(SHA-512 of password + salt, read only), salt and hash in base64.

Hashing is slow on purpose, so ``verify_async`` runs it in a thread and remembers successful
checks (keyed by a SHA-256 of the password, never the password itself).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ITERATIONS = 20_000
SALT_BYTES = 12
_DUMMY = f"$7${DEFAULT_ITERATIONS}${base64.b64encode(bytes(SALT_BYTES)).decode()}${base64.b64encode(bytes(64)).decode()}"


class AuthConfigError(ValueError):
    """A password file or ACL file that cannot be used; the message names file and line."""


@dataclass(frozen=True, slots=True)
class _Hash:
    kind: str  # "6" or "7"
    iterations: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: str) -> _Hash:
        parts = text.split("$")
        try:
            if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
                return cls("7", int(parts[2]), base64.b64decode(parts[3], validate=True),
                           base64.b64decode(parts[4], validate=True))
            if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
                return cls("6", 1, base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True))
        except ValueError:
            pass
        raise ValueError("not a $6$ or $7$ password hash")

    def compute(self, password: bytes) -> bytes:
        if self.kind == "7":
            return hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations)
        return hashlib.sha512(password + self.salt).digest()

    def check(self, password: bytes) -> bool:
        return hmac.compare_digest(self.compute(password), self.digest)

    def __str__(self) -> str:
        salt, digest = base64.b64encode(self.salt).decode(), base64.b64encode(self.digest).decode()
        if self.kind == "7":
            return f"$7${self.iterations}${salt}${digest}"
        return f"$6${salt}${digest}"


def hash_password(password: str | bytes, iterations: int = DEFAULT_ITERATIONS) -> str:
    raw = password.encode() if isinstance(password, str) else password
    salt = secrets.token_bytes(SALT_BYTES)
    return str(_Hash("7", iterations, salt, hashlib.pbkdf2_hmac("sha512", raw, salt, iterations)))


def _check_username(username: str) -> None:
    if not username or ":" in username or "\n" in username or "\r" in username:
        raise ValueError("a user name is non-empty and has no ':' or line break")


class PasswordFile:
    def __init__(self, users: dict[str, str] | None = None, *, cache_entries: int = 4096) -> None:
        self._users: dict[str, str] = dict(users or {})
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._cache_entries = cache_entries

    def __contains__(self, username: str) -> bool:
        return username in self._users

    def __len__(self) -> int:
        return len(self._users)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PasswordFile:
        users: dict[str, str] = {}
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise AuthConfigError(f"cannot read password file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise AuthConfigError(f"password file {path} is not UTF-8") from None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            username, sep, hashed = line.partition(":")
            try:
                if not sep:
                    raise ValueError("expected user:hash")
                _check_username(username)
                _Hash.parse(hashed)
            except ValueError as exc:
                raise AuthConfigError(f"{path}:{number}: {exc}") from None
            users[username] = hashed
        return cls(users)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temporary file, then rename), readable by the owner only."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                for username, hashed in self._users.items():
                    fh.write(f"{username}:{hashed}\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def set(self, username: str, password: str | bytes, *, iterations: int = DEFAULT_ITERATIONS) -> None:
        _check_username(username)
        self._users[username] = hash_password(password, iterations)
        self._forget(username)

    def delete(self, username: str) -> bool:
        self._forget(username)
        return self._users.pop(username, None) is not None

    def _forget(self, username: str) -> None:
        for key in [k for k in self._verified if k[0] == username]:
            del self._verified[key]

    def verify(self, username: str, password: str | bytes) -> bool:
        raw = password.encode() if isinstance(password, str) else password
        hashed = self._users.get(username)
        if hashed is None:
            _Hash.parse(_DUMMY).check(raw)  # same cost as a real check: no timing hint
            return False
        key = (username, hashlib.sha256(raw).digest())
        if key in self._verified:
            self._verified.move_to_end(key)
            return True
        if not _Hash.parse(hashed).check(raw):
            return False
        self._verified[key] = None
        if len(self._verified) > self._cache_entries:
            self._verified.popitem(last=False)
        return True

    async def verify_async(self, username: str, password: str | bytes) -> bool:
        raw = password.encode() if isinstance(password, str) else password
        hashed = self._users.get(username)
        if hashed is not None and (username, hashlib.sha256(raw).digest()) in self._verified:
            return self.verify(username, raw)  # remembered: no hashing
        return await asyncio.to_thread(self.verify, username, raw)
