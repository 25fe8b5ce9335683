"""The one retry loop of the data API's HTTP clients (``bridge.data_client.HttpClient.exchange``)
under its two policies: the Spark source's (502-504 and unreachable, for ``retryTimeoutMs``) and
the sink's (every 5xx and unreachable, ``attempts`` times), against a scripted HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bridge.data_client import HttpClient, SourceError
from spark_sinks.writer import PublishClient, PublishError


class ScriptedServer(ThreadingHTTPServer):
    """Answers each request with the next status of ``script`` (200 once it is spent)."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.seen: list[tuple[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's listener

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server: ScriptedServer = self.server  # type: ignore[assignment]
        server.seen.append((self.command, self.path))
        status = server.script.pop(0) if server.script else 200
        body = json.dumps({"queues": [], "stored": 1} if status == 200 else {"error": f"scripted {status}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator:
    servers: list[ScriptedServer] = []

    def start(*script: int) -> tuple[ScriptedServer, str]:
        server = ScriptedServer(list(script))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_source_retries_a_gateway_starting_or_stopping(serve) -> None:
    server, url = serve(502, 503, 504)
    assert HttpClient(url, retry_timeout_s=30).topic_queues(["#"]) == {}
    assert len(server.seen) == 4 and {path for _, path in server.seen} == {"/data/topics"}


def test_the_source_does_not_retry_other_answers(serve) -> None:
    server, url = serve(500)
    with pytest.raises(SourceError, match="answered 500: scripted 500"):
        HttpClient(url, retry_timeout_s=30).topic_queues(["#"])
    assert len(server.seen) == 1


def test_the_source_gives_up_after_its_retry_timeout(serve) -> None:
    server, url = serve(*[503] * 100)
    with pytest.raises(SourceError, match=r"answered 503.*gave up after 2 attempts in 0 s; option retryTimeoutMs"):
        HttpClient(url, retry_timeout_s=0).topic_queues(["#"])
    assert len(server.seen) == 2  # the first retry goes at once, whatever the timeout


def test_the_sink_retries_every_server_error(serve) -> None:
    server, url = serve(500, 503)
    assert PublishClient(url).publish(b"rows", {"batch": "w/0/0/0"}, attempts=3) == {"queues": [], "stored": 1}
    assert server.seen == [("POST", "/data/publish?batch=w%2F0%2F0%2F0")] * 3


def test_the_sink_gives_up_after_its_attempts(serve) -> None:
    server, url = serve(503, 503, 503)
    with pytest.raises(PublishError, match=r"/data/publish answered 503: scripted 503 \(gave up after 2 attempts\)"):
        PublishClient(url).publish(b"rows", {"batch": "k"}, attempts=2)
    assert len(server.seen) == 2


def test_the_sink_does_not_retry_a_refusal(serve) -> None:
    server, url = serve(403)
    with pytest.raises(PublishError, match="answered 403: scripted 403"):
        PublishClient(url).publish(b"rows", {"batch": "k"}, attempts=5)
    assert len(server.seen) == 1
