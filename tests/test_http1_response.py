"""protocols.http1 without a network: answers read whatever way their bytes are split, interim
answers passed over, bodies framed by length, chunks or the connection's end, bad bytes refused;
a request's bytes, with the headers a URL gives and a line break refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.http1 import Answer, RequestHead, ResponseError, ResponseReader

ANSWERS = (b"HTTP/1.1 100 Continue\r\n\r\n"
           b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
           b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n10\r\n" + b"x" * 16
           + b"\r\n0\r\nTrailer: t\r\n\r\n"
           b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n"
           b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\nConnection: close\r\n\r\n")
EXPECTED = [Answer(200, False), Answer(201, False), Answer(204, False), Answer(503, True)]


@given(st.lists(st.integers(min_value=0, max_value=len(ANSWERS)), max_size=12))
def test_answers_read_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    reader = ResponseReader()
    answers = []
    bounds = [0, *sorted(cuts), len(ANSWERS)]
    for start, end in zip(bounds, bounds[1:]):
        answers += reader.feed(ANSWERS[start:end])
    assert answers == EXPECTED and reader.idle


def test_a_body_to_the_connections_end_and_http_1_0() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\nsome") == [] and not reader.idle
    assert reader.feed(b" more") == []
    assert reader.closed() == Answer(200, True)
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n") == [Answer(200, True)]
    assert reader.feed(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n") == [
        Answer(200, False)]


@pytest.mark.parametrize("data", [
    b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000])
def test_bytes_that_are_not_an_answer_are_refused(data: bytes) -> None:
    with pytest.raises(ResponseError):
        ResponseReader().feed(data)


def test_a_request_carries_the_urls_host_target_and_credentials_and_refuses_a_line_break() -> None:
    head = RequestHead("https://user:p%40ss@[::1]:8443/hooks/a b?x=1#frag", [("X-Site", "berlin"),
                                                                           ("Content-Type", "text/plain")])
    assert (head.tls, head.host, head.port) == (True, "::1", 8443)
    request = head.bytes_of({"ce-id": "1"}, b"{}")
    assert request.startswith(b"POST /hooks/a%20b?x=1 HTTP/1.1\r\nHost: [::1]:8443\r\n"
                              b"Authorization: Basic dXNlcjpwQHNz\r\n")
    assert request.endswith(b"X-Site: berlin\r\nContent-Type: text/plain\r\nce-id: 1\r\nContent-Length: 2\r\n\r\n{}")
    assert b"text/plain" not in head.bytes_of({"Content-Type": "application/json"}, b"")  # (the event's own wins)
    with pytest.raises(ValueError, match="line break"):
        head.bytes_of({"Content-Type": "text/plain\r\nX-Injected: 1"}, b"")
    with pytest.raises(ValueError):
        head.bytes_of({"ce-subject": "\u20ac"}, b"")
    with pytest.raises(ValueError, match="client's to set"):
        RequestHead("http://h/", [("Content-Length", "3")])
    assert RequestHead("http://h").bytes_of({}, b"").startswith(b"POST / HTTP/1.1\r\nHost: h\r\n")
