"""Who may use the HTTP listener's admin API, data API and dashboard (gateway/http/app.py,
data_access.py): once any authentication is configured, every route but the public ones
(metrics, probes, the dashboard's static page) refuses anonymous requests; the admin token or
a password-file user named in ``admin_users`` is the operator; other users reach the data API
only, under the ACL. A listener beyond loopback without admin credentials does not start."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway.auth import PasswordFile
from gateway.http.app import PUBLIC_PATHS
from gateway.server import Gateway

from .mqtt_support import PahoClient, mqtt_port, running_gateway

ROOT = Path(__file__).resolve().parent.parent
ACL = "user alice\ntopic readwrite #\nuser root\ntopic read nothing/#\n"


def write_users(folder: Path) -> str:
    users = PasswordFile()
    for name in ("alice", "root"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(folder / "passwd")
    return str(folder / "passwd")


def http(gw: Gateway, method: str, path: str, *, auth: str | None = None, body: bytes | None = None
         ) -> tuple[int, bytes]:
    host, port = gw.metrics_address  # type: ignore[misc]
    request = urllib.request.Request(f"http://{host}:{port}{path}", method=method, data=body)
    if auth:
        request.add_header("Authorization", auth)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect is an answer here, not followed
        return None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def routes(gw: Gateway) -> list[tuple[str, str]]:
    """(method, path) of every route the listener registered (HEAD comes with GET)."""
    assert gw.http is not None
    found = []
    for route in gw.http.app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path is not None, f"a route without a plain path: {route}"
        if route.method != "HEAD":
            found.append((route.method, path.replace("{", "").replace("}", "")))
    return found


AUTH_SETTINGS = {
    "password file": lambda folder: {"password_file": write_users(folder)},
    "acl": lambda folder: {"acl_file": str(folder / "acl")},
    "access keys": lambda folder: {"access_keys_file": str(folder / "keys")},
    "anonymous off": lambda folder: {"allow_anonymous": False},
}


@pytest.mark.parametrize("setting", sorted(AUTH_SETTINGS))
async def test_every_route_but_the_public_ones_refuses_anonymous_requests(data_dir: Path, tmp_path: Path,
                                                                          setting: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "acl").write_text(ACL)
    (tmp_path / "keys").write_text("AK1 SK1 alice\n")
    os.chmod(tmp_path / "keys", 0o600)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="mqtt",
                               **AUTH_SETTINGS[setting](tmp_path)) as gw:
        # nobody can be the operator here: start-up said so
        assert "the admin API refuses every request" in caplog.text and "admin_users" in caplog.text
        registered = routes(gw)
        assert {path for _, path in registered} >= {"/admin/messages", "/admin/trace", "/admin/kick",
                                                     "/admin/overview", "/data/read", "/data/publish"}
        assert {path for _, path in registered if path in PUBLIC_PATHS} == {
            "/metrics", "/healthz", "/readyz", "/", "/dashboard", "/dashboard/static/app.js",
            "/dashboard/static/style.css"}
        for method, path in registered:
            status, body = await asyncio.to_thread(http, gw, method, path, body=b"{}" if method == "POST" else None)
            if path in PUBLIC_PATHS:
                assert status in (200, 302), (method, path, status)
            else:
                assert status == 401, (method, path, status, body[:200])
                assert "credentials" in json.loads(body)["error"] or "token" in json.loads(body)["error"]
        # a bad Bearer or Basic header is no way around it
        status, _ = await asyncio.to_thread(http, gw, "GET", "/admin/clients", auth="Bearer guess")
        assert status == 401
        status, _ = await asyncio.to_thread(http, gw, "GET", "/admin/clients", auth=basic("alice", "wrong"))
        assert status == 401


async def test_message_bodies_are_not_given_to_anonymous_callers(data_dir: Path, tmp_path: Path) -> None:
    """The report: a password file, an ACL, anonymous off -- and /admin/messages gave bodies away."""
    (tmp_path / "acl").write_text(ACL)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=write_users(tmp_path),
                               acl_file=str(tmp_path / "acl"), allow_anonymous=False) as gw:
        device = PahoClient(mqtt_port(gw), "dev-1", username="alice", password="pw-alice")
        await device.connect()
        await device.publish("plant/secret", b"the recipe", qos=1)
        await device.disconnect()
        msg_id = gw.store.get_now("t:plant/secret", 0, 1).messages[0].msg_id
        status, body = await asyncio.to_thread(http, gw, "GET", f"/admin/messages?msg_id={msg_id}")
        assert status == 401 and b"the recipe" not in body
        status, body = await asyncio.to_thread(http, gw, "GET", "/data/read?queue=t:plant/secret&start=0")
        assert status == 401 and b"the recipe" not in body
        status, body = await asyncio.to_thread(http, gw, "GET", "/metrics")  # metrics: counts, never bodies
        assert status == 200 and b"the recipe" not in body and b"tidemq_messages_received_total" in body


async def test_admin_users_are_the_operator_and_other_users_reach_the_data_api_only(data_dir: Path,
                                                                                    tmp_path: Path) -> None:
    (tmp_path / "acl").write_text(ACL)
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=write_users(tmp_path),
                               acl_file=str(tmp_path / "acl"), allow_anonymous=False, admin_users="root",
                               admin_token="T0K") as gw:
        device = PahoClient(mqtt_port(gw), "dev-1", username="alice", password="pw-alice")
        await device.connect()
        await device.publish("plant/a", b"reading", qos=1)
        await device.disconnect()
        for auth in (basic("root", "pw-root"), "Bearer T0K"):
            status, body = await asyncio.to_thread(http, gw, "GET", "/admin/clients", auth=auth)
            assert status == 200, body
            # the operator reads every queue, whatever the ACL says of the user (root may read nothing/#)
            status, body = await asyncio.to_thread(http, gw, "GET", "/data/offsets?queue=t:plant/a", auth=auth)
            assert status == 200, body
        status, body = await asyncio.to_thread(http, gw, "GET", "/admin/clients", auth=basic("alice", "pw-alice"))
        assert status == 403 and "admin_users" in json.loads(body)["error"]
        status, body = await asyncio.to_thread(http, gw, "GET", "/admin/overview", auth=basic("alice", "pw-alice"))
        assert status == 403
        status, body = await asyncio.to_thread(http, gw, "GET", "/data/offsets?queue=t:plant/a",
                                               auth=basic("alice", "pw-alice"))
        assert status == 200, body  # alice's ACL lets her read it
        status, body = await asyncio.to_thread(http, gw, "GET", "/admin/clients", auth=basic("root", "wrong"))
        assert status == 401


async def test_without_any_authentication_loopback_tools_need_no_credentials(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        status, _ = await asyncio.to_thread(http, gw, "GET", "/admin/clients")
        assert status == 200


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"),
                           "--mqtt-bind", "", "--amqp-bind", "", "--remoting-bind", "", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "[::]:0", "10.1.2.3:0", "metrics.example:0"])
def test_a_listener_beyond_loopback_without_admin_credentials_does_not_start(tmp_path: Path, bind: str) -> None:
    proc = serve(tmp_path, "--metrics-bind", bind)
    assert proc.returncode == 2, proc.stderr
    assert "metrics_bind" in proc.stderr and "admin_token" in proc.stderr and "admin_users" in proc.stderr
    assert not (tmp_path / "data").exists()  # refused before anything opened


def test_blank_admin_users_are_no_admin_credentials(tmp_path: Path) -> None:
    """``admin_users = ","`` names nobody: beyond loopback it does not stand in for credentials."""
    proc = serve(tmp_path, "--metrics-bind", "0.0.0.0:0", "--admin-users", " , ")
    assert proc.returncode == 2 and "metrics_bind" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()


def test_admin_users_need_the_password_file(tmp_path: Path) -> None:
    proc = serve(tmp_path, "--metrics-bind", "127.0.0.1:0", "--admin-users", "root")
    assert proc.returncode == 2 and "admin_users" in proc.stderr and "password_file" in proc.stderr, proc.stderr


async def test_a_user_holds_only_filters_it_may_read(data_dir: Path, tmp_path: Path) -> None:
    """POST /data/filters makes the gateway index a filter's messages for its reader: a user may
    ask that only of what the ACL lets it read."""
    (tmp_path / "acl").write_text("user alice\ntopic read public/#\n")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=write_users(tmp_path),
                               acl_file=str(tmp_path / "acl"), allow_anonymous=False) as gw:
        alice = basic("alice", "pw-alice")
        for topic_filter, expected in (("secret/#", 403), ("#", 403), ("public/+", 200)):
            body = json.dumps({"topicFilter": topic_filter, "lease_ms": 60_000}).encode()
            status, answer = await asyncio.to_thread(http, gw, "POST", "/data/filters", auth=alice, body=body)
            assert status == expected, (topic_filter, answer)
