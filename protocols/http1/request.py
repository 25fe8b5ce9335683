"""The bytes of a POST request: the lines every request to one URL shares encoded once, the
headers of each request (its body's length among them) added to them, refused when a value
would break the request's framing."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Mapping, Sequence

PATH_SAFE = "/%:@!$&'()*+,;=-._~"
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


class RequestHead:
    """POST requests to one ``http://`` or ``https://`` URL with ``headers`` on each; a request's
    own headers (``bytes_of``) win over those of the same name."""

    def __init__(self, url: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)  # (ValueError: a port that is not one)
        target = urllib.parse.quote(parts.path or "/", safe=PATH_SAFE)
        if parts.query:
            target += "?" + urllib.parse.quote(parts.query, safe=PATH_SAFE + "?")
        shared: dict[str, str] = {"Host": parts.netloc.rpartition("@")[2]}
        if parts.username is not None:
            credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            shared["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        shared["User-Agent"] = "tidemq"
        self._defaults: dict[str, str] = {}  # (headers a request may set itself: only when it does not)
        for name, value in headers:
            lower = name.lower()
            if lower in FRAMING_HEADERS:
                raise ValueError(f"the header {name} is the client's to set")
            if lower == "content-type" or lower.startswith("ce-"):
                self._defaults[name] = value
            else:
                shared = {k: v for k, v in shared.items() if k.lower() != lower}
                shared[name] = value
        self._prefix = (f"POST {target} HTTP/1.1\r\n" + _lines(shared)).encode("latin-1")

    def bytes_of(self, headers: Mapping[str, str], body: bytes) -> bytes:
        """The request with ``headers`` and ``body`` (ValueError: a header name or value with a
        line break or a character that is not Latin-1)."""
        if self._defaults:
            lower = {name.lower() for name in headers}
            headers = {**{k: v for k, v in self._defaults.items() if k.lower() not in lower}, **headers}
        own = _lines(headers)
        if own.count("\n") != len(headers) or own.count("\r") != len(headers):
            raise ValueError("a header name or value holds a line break")
        return b"".join((self._prefix, own.encode("latin-1"), b"Content-Length: %d\r\n\r\n" % len(body), body))


def _lines(headers: Mapping[str, str]) -> str:
    return "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
