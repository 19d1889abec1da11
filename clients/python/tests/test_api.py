"""The HTTP API itself, through a real HTTP client (httpx, raw sockets,
curl, websockets): keys and ownership, bad input with its exact status and
code, limits, streams and offsets, ranges, WebSockets, metrics, OpenAPI."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, namzu_bin


def err(r, status, code, field=None):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code, body
    if field is not None:
        assert body.get("field") == field, body
    return body


# ---- keys and ownership


def test_missing_or_wrong_key_is_401_and_health_needs_none(server):
    import httpx

    with httpx.Client(base_url=server.url) as anon:
        err(anon.get("/v1/sandboxes"), 401, "unauthorized")
        err(anon.get("/v1/sandboxes", headers={"Authorization": "Bearer nz_" + "0" * 64}), 401, "unauthorized")
        err(anon.get("/v1/sandboxes", headers={"X-API-Key": server.keys["alice"] + "x"}), 401, "unauthorized")
        assert anon.get("/v1/sandboxes", headers={"X-API-Key": server.keys["alice"]}).status_code == 200
        assert anon.get("/v1/health").json()["status"] == "ok"


def test_another_keys_sandbox_is_404_everywhere_and_never_listed(alice, bob, sandbox):
    sid = sandbox["id"]
    p = f"/v1/sandboxes/{sid}"
    for r in (
        bob.get(p),
        bob.delete(p),
        bob.post(f"{p}/timeout", json={"timeout_s": 10}),
        bob.post(f"{p}/commands/run", json={"script": "echo x"}),
        bob.post(f"{p}/commands", json={"script": "echo x"}),
        bob.get(f"{p}/commands"),
        bob.get(f"{p}/files/content", params={"path": "/etc/hostname"}),
        bob.put(f"{p}/files/content", params={"path": "x"}, content=b"x"),
        bob.get(f"{p}/network"),
    ):
        err(r, 404, "sandbox_not_found")
    # The same answer as for an id that exists nowhere: no existence leak.
    nowhere = bob.get("/v1/sandboxes/sb-000000000000").json()
    assert nowhere["code"] == "sandbox_not_found"
    assert sid not in [s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]]
    assert sid in [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]]
    assert alice.get(p).status_code == 200, "bob's attempts changed nothing"


# ---- bad input


def test_bad_json_unknown_fields_and_content_type(alice):
    err(alice.post("/v1/sandboxes", content=b"{bad", headers={"content-type": "application/json"}), 400, "malformed_json")
    err(alice.post("/v1/sandboxes", json={"colour": "red"}), 400, "invalid_argument", "colour")
    err(alice.post("/v1/sandboxes", json={"timeout_s": "soon"}), 400, "invalid_argument")
    err(alice.post("/v1/sandboxes", json={"resources": {"memory": 1}}), 400, "invalid_argument", "memory")
    err(alice.post("/v1/sandboxes", content=b"{}"), 415, "unsupported_media_type")
    err(alice.post("/v1/sandboxes", json={"timeout_s": 0}), 400, "invalid_argument", "timeout_s")
    err(alice.get("/v1/nothing"), 404, "no_route")
    err(alice.put("/v1/sandboxes"), 405, "method_not_allowed")


def test_bad_ids_are_400_before_any_lookup(alice, sandbox):
    err(alice.get("/v1/sandboxes/a%20b"), 400, "invalid_argument", "id")
    err(alice.get("/v1/sandboxes/..."), 400, "invalid_argument", "id")
    p = f"/v1/sandboxes/{sandbox['id']}"
    err(alice.post(f"{p}/commands/a%2Fb/cancel"), 400, "invalid_argument", "execution_id")
    err(alice.post(f"{p}/commands", json={"script": "true", "execution_id": "no/slash"}), 400, "invalid_argument", "execution_id")
    err(alice.get(f"{p}/commands/nope/events"), 409, "execution_not_attachable", "execution_id")


def test_paths_escaping_the_sandbox_are_refused(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/files"
    for r in (
        alice.get(f"{p}/content", params={"path": "../../../../etc/shadow"}),
        alice.put(f"{p}/content", params={"path": "/workspace/../../../tmp/x"}, content=b"x"),
        alice.get(f"{p}/stat", params={"path": "../../.."}),
    ):
        err(r, 400, "path_escape", "path")


def test_options_a_tier_cannot_honour_are_refused_by_name(alice):
    err(alice.post("/v1/sandboxes", json={"tier": "local", "runtime": "runsc"}), 422, "option_refused", "runtime")
    err(alice.post("/v1/sandboxes", json={"tier": "host", "resources": {"pids": 10}}), 422, "option_refused", "resources.pids")
    err(alice.post("/v1/sandboxes", json={"tier": "host", "network": {"mode": "allow-all"}}), 422, "option_refused", "network")
    err(alice.post("/v1/sandboxes", json={"tier": "docker"}), 422, "tier_unavailable", "tier")
    err(alice.post("/v1/sandboxes", json={"tier": "bogus"}), 400, "invalid_argument", "tier")
    err(alice.post("/v1/sandboxes", json={"network": {"mode": "sometimes"}}), 400, "invalid_argument", "network.mode")
    # An id is looked up, never pulled; a registry reference is pulled,
    # and a registry nobody answers for is told apart from a missing image.
    err(alice.post("/v1/sandboxes", json={"image": "sha256:" + "0" * 64}), 422, "image_not_found", "image")
    err(alice.post("/v1/sandboxes", json={"image": "127.0.0.1:1/no-such-image:1"}), 502, "registry_unreachable", "image")
    # Nothing was left behind by the refusals.
    assert alice.get("/v1/sandboxes", params={"limit": 1000}).json()["sandboxes"] == [] or all(
        s["tier"] == "local" for s in alice.get("/v1/sandboxes").json()["sandboxes"]
    )


def test_body_over_the_limit_is_413_naming_it(fresh_server):
    s = fresh_server("--max-body-bytes", "512", "--max-upload-bytes", "4096")
    with s.client() as c:
        err(c.post("/v1/sandboxes", json={"metadata": {"k": "v" * 2000}}), 413, "limit_exceeded", "max_body_bytes")
        sb = c.post("/v1/sandboxes", json={}).json()
        p = f"/v1/sandboxes/{sb['id']}/files/content"
        assert c.put(p, params={"path": "keep.txt"}, content=b"old").status_code == 200
        err(c.put(p, params={"path": "keep.txt"}, content=b"x" * 5000), 413, "limit_exceeded", "max_upload_bytes")
        # Chunked, so the server only learns the size while streaming.
        err(c.put(p, params={"path": "keep.txt"}, content=iter([b"y" * 3000, b"y" * 3000])), 413, "limit_exceeded", "max_upload_bytes")
        assert c.get(p, params={"path": "keep.txt"}).content == b"old"
        names = [f["name"] for f in c.get(f"/v1/sandboxes/{sb['id']}/files/list", params={"path": "."}).json()]
        assert names == ["keep.txt"], f"no temporary left: {names}"


def test_an_upload_dropped_midway_keeps_the_old_file_and_no_temporary(server, alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/files"
    assert alice.put(f"{p}/content", params={"path": "doc.txt"}, content=b"version 1").status_code == 200
    host, port = server.url.split("://")[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.sendall(
        (
            f"PUT {p}/content?path=doc.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.keys['alice']}\r\n"
            "Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
        ).encode()
        + b"z" * 70000
    )
    time.sleep(0.5)
    s.close()
    time.sleep(1.0)
    assert alice.get(f"{p}/content", params={"path": "doc.txt"}).content == b"version 1"
    names = [f["name"] for f in alice.get(f"{p}/list", params={"path": "."}).json()]
    assert names == ["doc.txt"], f"no temporary left: {names}"


# ---- limits


def test_sandboxes_per_key_is_429_and_per_key(fresh_server):
    s = fresh_server("--max-sandboxes-per-key", "2")
    with s.client("alice") as a, s.client("bob") as b:
        assert a.post("/v1/sandboxes", json={}).status_code == 201
        assert a.post("/v1/sandboxes", json={}).status_code == 201
        err(a.post("/v1/sandboxes", json={}), 429, "limit_exceeded", "max_sandboxes_per_key")
        assert b.post("/v1/sandboxes", json={}).status_code == 201, "another key has its own count"
        first = a.get("/v1/sandboxes").json()["sandboxes"][0]["id"]
        assert a.delete(f"/v1/sandboxes/{first}").status_code == 204
        assert a.post("/v1/sandboxes", json={}).status_code == 201, "a destroy frees a place"


def test_streams_per_key_is_429(fresh_server):
    s = fresh_server("--max-streams-per-key", "1")
    with s.client() as c:
        sid = c.post("/v1/sandboxes", json={}).json()["id"]
        p = f"/v1/sandboxes/{sid}/commands"
        with c.stream("POST", p, json={"script": "sleep 3; echo done"}) as held:
            assert held.status_code == 200
            err(c.post(p, json={"script": "echo second"}), 429, "limit_exceeded", "max_streams_per_key")
            err(c.get(f"/v1/sandboxes/{sid}/files/content", params={"path": "/etc/hostname"}), 429, "limit_exceeded", "max_streams_per_key")
            lines = [json.loads(x) for x in held.iter_lines() if x]
        assert lines[-1]["type"] == "exit"
        assert c.post(p, json={"script": "echo again"}).status_code == 200, "the slot came back"


def test_slow_request_heads_are_cut_off(fresh_server):
    s = fresh_server("--header-read-timeout", "1")
    host, port = s.url.split("://")[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    sock.settimeout(10)
    started = time.monotonic()
    got = sock.recv(1024)
    waited = time.monotonic() - started
    assert got == b"" or got.startswith(b"HTTP/1.1 408"), got
    assert waited < 8, waited


# ---- commands


def test_ndjson_chunks_carry_stream_offset_and_resume_point(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/commands"
    with alice.stream("POST", p, json={"script": "printf ab; printf cd >&2; printf ef; exit 2"}) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        evs = [json.loads(x) for x in r.iter_lines() if x]
    assert evs[0]["type"] == "start"
    out = [e for e in evs if e["type"] == "stdout"]
    assert b"".join(base64.b64decode(e["data"]) for e in out) == b"abef"
    assert [e["next_offset"] for e in evs[1:]] == sorted(e["next_offset"] for e in evs[1:])
    assert evs[-1]["type"] == "exit" and evs[-1]["status"]["code"] == 2 and evs[-1]["next_offset"] == 6
    eid = evs[0]["execution_id"]
    # Re-attach from the middle: exactly the bytes after that offset.
    mid = evs[1]["next_offset"]
    with alice.stream("GET", f"{p}/{eid}/events", params={"offset": mid}) as r:
        rest = [json.loads(x) for x in r.iter_lines() if x]
    got = b"".join(base64.b64decode(e["data"]) for e in rest if e["type"] in ("stdout", "stderr"))
    assert len(got) == 6 - mid and rest[-1]["type"] == "exit"


def test_sse_framing_and_last_event_id(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/commands"
    with alice.stream("POST", p, json={"script": "echo one; echo two", "execution_id": "sse1"}, headers={"Accept": "text/event-stream"}) as r:
        assert r.headers["content-type"] == "text/event-stream"
        text = r.read().decode()
    blocks = [b for b in text.split("\n\n") if b]
    kinds = [b.split("\n")[0] for b in blocks]
    assert kinds[0] == "event: start" and kinds[-1] == "event: exit"
    first_out = next(b for b in blocks if b.startswith("event: stdout"))
    last_id = first_out.split("\n")[1].removeprefix("id: ")
    with alice.stream("GET", f"{p}/sse1/events", headers={"Accept": "text/event-stream", "Last-Event-ID": last_id}) as r:
        rest = r.read().decode()
    data = [json.loads(line[6:]) for line in rest.split("\n") if line.startswith("data: ")]
    got = b"".join(base64.b64decode(d["data"]) for d in data if d["type"] == "stdout")
    assert got == b"one\ntwo\n"[int(last_id):]


def test_detached_by_name_list_and_cancel(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/commands"
    r = alice.post(p, json={"argv": ["sleep", "60"], "execution_id": "sleeper", "detached": True})
    assert r.status_code == 201 and r.json()["execution_id"] == "sleeper" and r.json()["pid"] > 0
    # A start under a name already held attaches to it: a retried start
    # never runs the command twice.
    again = alice.post(p, json={"argv": ["sleep", "60"], "execution_id": "sleeper", "detached": True})
    assert again.status_code == 201 and again.json()["pid"] == r.json()["pid"]
    assert [e["execution_id"] for e in alice.get(p).json()].count("sleeper") == 1
    running = {e["execution_id"]: e for e in alice.get(p).json()}
    assert running["sleeper"]["state"] == "running"
    assert alice.post(f"{p}/sleeper/cancel").json()["outcome"] == "killed"
    ended = {e["execution_id"]: e for e in alice.get(p).json()}
    assert ended["sleeper"]["state"] == "exited" and ended["sleeper"]["status"]["signal"] == 9
    err(alice.post(f"{p}/never-was/cancel"), 404, "execution_not_found")


# ---- files


def test_range_requests(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/files/content"
    alice.put(p, params={"path": "r.bin"}, content=bytes(range(100)))
    r = alice.get(p, params={"path": "r.bin"}, headers={"Range": "bytes=10-19"})
    assert r.status_code == 206 and r.content == bytes(range(10, 20))
    assert r.headers["content-range"] == "bytes 10-19/100"
    r = alice.get(p, params={"path": "r.bin"}, headers={"Range": "bytes=-5"})
    assert r.status_code == 206 and r.content == bytes(range(95, 100))
    r = alice.get(p, params={"path": "r.bin"}, headers={"Range": "bytes=100-"})
    err(r, 416, "range_not_satisfiable")
    assert r.headers["content-range"] == "bytes */100"
    r = alice.get(p, params={"path": "r.bin"})
    assert r.status_code == 200 and r.headers["accept-ranges"] == "bytes" and len(r.content) == 100
    err(alice.get(p, params={"path": "."}), 409, "not_a_regular_file", "path")
    err(alice.get(p, params={"path": "nope"}), 404, "file_not_found", "path")


def test_file_operations(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/files"
    assert alice.post(f"{p}/mkdir", json={"path": "a/b/c", "parents": True}).status_code == 204
    err(alice.post(f"{p}/mkdir", json={"path": "a"}), 409, "already_exists", "path")
    alice.put(f"{p}/content", params={"path": "a/b/c/f.txt", "mode": "600"}, content=b"f")
    err(alice.put(f"{p}/content", params={"path": "a/x", "mode": "999"}, content=b"f"), 400, "invalid_argument", "mode")
    walk = alice.get(f"{p}/walk", params={"path": "a"}).json()
    assert sorted(w["name"] for w in walk) == ["b", "c", "f.txt"]
    err(alice.get(f"{p}/walk", params={"path": "a", "max_entries": 1}), 422, "walk_limit", "max_entries")
    assert alice.post(f"{p}/rename", json={"from": "a/b/c/f.txt", "to": "g.txt"}).status_code == 204
    assert alice.get(f"{p}/stat", params={"path": "g.txt"}).json()["mode"] & 0o777 == 0o600
    err(alice.delete(f"{p}", params={"path": "a"}), 409, "directory_not_empty", "path")
    assert alice.delete(f"{p}", params={"path": "a", "recursive": "true"}).status_code == 204
    err(alice.get(f"{p}/list", params={"path": "a"}), 404, "file_not_found")
    err(alice.get(f"{p}/list", params={"path": "g.txt", "extra": "1"}), 400, "invalid_argument", "extra")


# ---- live: network, terminal, TCP, quiesce, flush


def test_network_policy_get_and_set_live(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/network"
    assert alice.get(p).json()["policy"] == {"mode": "none"}
    r = alice.put(p, json={"mode": "allowlist", "allow": [{"host": "pypi.org", "ports": [443]}, {"host": ".example.com"}]})
    assert r.status_code == 200, r.text
    assert r.json()["policy"]["allow"] == [{"host": "pypi.org", "ports": [443]}, {"host": ".example.com"}]
    assert alice.get(p).json()["policy"]["mode"] == "allowlist"
    err(alice.put(p, json={"mode": "allowlist", "allow": [{"host": "https://x.org"}]}), 400, "invalid_policy", "network")
    err(alice.put(p, json={"mode": "none", "allow": [{"host": "x.org"}]}), 400, "invalid_argument", "network")


def test_network_on_the_host_tier_is_refused(alice):
    sb = alice.post("/v1/sandboxes", json={"tier": "host"}).json()
    try:
        err(alice.get(f"/v1/sandboxes/{sb['id']}/network"), 422, "option_refused")
    finally:
        alice.delete(f"/v1/sandboxes/{sb['id']}")


def ws_url(server, path):
    return server.url.replace("http://", "ws://") + path


def read_terminal(ws, timeout=30):
    """A terminal WebSocket's bytes up to its exit frame, and that frame; any
    other text frame (an error) fails the test."""
    out = b""
    while True:
        m = ws.recv(timeout=timeout)
        if isinstance(m, bytes):
            out += m
            continue
        d = json.loads(m)
        assert d["type"] == "exit", d
        return out, d


def test_terminal_over_websocket(server, sandbox):
    from websockets.sync.client import connect

    url = ws_url(server, f"/v1/sandboxes/{sandbox['id']}/terminal?cols=100&rows=30&command=sh")
    with connect(url, additional_headers={"Authorization": f"Bearer {server.keys['alice']}"}) as ws:
        ws.send(json.dumps({"type": "resize", "cols": 123, "rows": 45}))
        ws.send(b"stty size; echo mark$((40+2)); exit 4\n")
        out, exit_msg = read_terminal(ws)
    assert b"45 123" in out and b"mark42" in out, out
    assert exit_msg["code"] == 4


def test_terminal_input_after_its_exit_keeps_output_and_exit(server, sandbox):
    """Input that reaches the server after the shell exited must not cost the
    output still on its way or the exit frame. The client reads nothing (a
    4 KiB receive buffer, a queue of one frame) until the shell has printed
    more than the server's socket holds and exited, then types."""
    import socket
    import time

    from websockets.sync.client import connect

    host, port = server.url.split("://")[1].rsplit(":", 1)
    url = ws_url(server, f"/v1/sandboxes/{sandbox['id']}/terminal?command=sh")
    hdr = {"Authorization": f"Bearer {server.keys['alice']}"}
    size = 6_000_000
    for _ in range(2):
        so = socket.socket()
        so.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        so.connect((host, int(port)))
        with connect(url, sock=so, additional_headers=hdr, max_queue=1) as ws:
            ws.send(f"head -c {size} /dev/zero | tr '\\0' x; exit 3\n".encode())
            time.sleep(1.5)  # ordering: the shell is gone, the server blocked
            ws.send(b"late\n")
            time.sleep(0.3)
            out, exit_msg = read_terminal(ws)
        assert exit_msg["code"] == 3, exit_msg
        # The echoed command line holds two more x's.
        assert out.count(b"x") == size + 2, len(out)


def test_tcp_port_forward_over_websocket(server, alice, sandbox):
    from websockets.sync.client import connect

    p = f"/v1/sandboxes/{sandbox['id']}"
    echo = (
        "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('127.0.0.1',7007));s.listen()\n"
        "c,_=s.accept()\nwhile True:\n d=c.recv(65536)\n if not d: break\n c.sendall(d.upper())\nc.close()\n"
    )
    alice.post(f"{p}/commands", json={"argv": ["python3", "-c", echo], "detached": True, "execution_id": "echo"})
    hdr = {"Authorization": f"Bearer {server.keys['alice']}"}
    from websockets.exceptions import InvalidStatus

    ws = None
    for _ in range(100):
        try:
            ws = connect(ws_url(server, f"{p}/ports/7007"), additional_headers=hdr)
            break
        except InvalidStatus as e:
            assert e.response.status_code == 502, e.response.status_code
            time.sleep(0.1)
    assert ws is not None, "the echo server never listened"
    with ws:
        payload = b"hello sandbox " * 5000
        ws.send(payload)
        got = b""
        while len(got) < len(payload):
            got += ws.recv(timeout=20)
    assert got == payload.upper()


def test_nothing_listening_is_502_before_the_upgrade(server, alice, sandbox):
    import httpx

    r = alice.get(
        f"/v1/sandboxes/{sandbox['id']}/ports/7999",
        headers={"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
    )
    err(r, 502, "connection_refused", "port")
    assert isinstance(r, httpx.Response)


def test_quiesce_and_flush(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}"
    alice.post(f"{p}/commands", json={"argv": ["sleep", "100"], "detached": True})
    q = alice.post(f"{p}/quiesce", json={"grace_ms": 500}).json()
    assert any(s["comm"] == "sleep" for s in q["stopped"]), q
    assert alice.post(f"{p}/flush", json={}).status_code == 200
    err(alice.post(f"{p}/flush", json={"timeout": 1}), 400, "invalid_argument", "timeout")


def test_pause_and_resume(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}"
    alice.post(f"{p}/commands", json={"argv": ["sleep", "100"], "detached": True})
    paused = alice.post(f"{p}/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["stopped"] and paused.json()["rounds"] >= 1, paused.json()
    assert alice.get(p).json()["state"] == "paused"
    err(alice.post(f"{p}/commands/run", json={"script": "echo no"}), 409, "sandbox_paused")
    # Files go on while paused.
    assert alice.put(f"{p}/files/content", params={"path": "p.txt"}, content=b"kept").status_code in (200, 201, 204)
    again = alice.post(f"{p}/pause").json()
    assert again["rounds"] == 0 and again["stopped"] == paused.json()["stopped"], again
    resumed = alice.post(f"{p}/resume").json()
    assert set(resumed["continued"]) == set(paused.json()["stopped"]) and resumed["paused_ms"] >= 0, resumed
    assert alice.get(p).json()["state"] == "running"
    r = alice.post(f"{p}/commands/run", json={"script": "cat p.txt"})
    assert r.json()["stdout"] == "kept", r.text


def test_suspend_and_resume_from_disk(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}"
    r = alice.post(f"{p}/commands/run", json={"script": "echo t > /tmp/t; echo w > w.txt; sleep 300 >/dev/null 2>&1 </dev/null &"})
    assert r.status_code == 200, r.text
    suspended = alice.post(f"{p}/suspend")
    assert suspended.status_code == 200, suspended.text
    assert suspended.json()["state"] == "suspended"
    assert alice.get(p).json()["state"] == "suspended"
    err(alice.post(f"{p}/commands/run", json={"script": "echo no"}), 409, "sandbox_suspended")
    # Suspending again is done.
    assert alice.post(f"{p}/suspend").json()["state"] == "suspended"
    resumed = alice.post(f"{p}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json() == {"continued": [], "paused_ms": 0, "from_disk": True}, resumed.json()
    view = alice.get(p).json()
    assert view["state"] == "running" and view["expires_at_ms"] > time.time() * 1000, view
    r = alice.post(f"{p}/commands/run", json={"script": "cat /tmp/t w.txt; pgrep -x sleep || echo none"})
    assert r.json()["stdout"] == "t\nw\nnone\n", r.text


def test_snapshots_are_refused_by_name_where_memory_is_not_kept(alice, bob, sandbox):
    # The local tier keeps no memory: refused, naming the operation.
    err(alice.post(f"/v1/sandboxes/{sandbox['id']}/snapshot"), 422, "option_refused", "snapshot")
    err(bob.post(f"/v1/sandboxes/{sandbox['id']}/snapshot"), 404, "sandbox_not_found")
    assert alice.get("/v1/snapshots").json() == {"snapshots": []}
    err(alice.post("/v1/snapshots/snap-000000000001/fork"), 404, "snapshot_not_found")
    err(alice.delete("/v1/snapshots/snap-000000000001"), 404, "snapshot_not_found")
    err(alice.post("/v1/snapshots/..%2Fx/fork"), 400, "invalid_argument", "snapshot")


# ---- lifetime


def test_on_timeout_suspend_suspends_instead_of_destroying(alice):
    sb = alice.post("/v1/sandboxes", json={"timeout_s": 1, "on_timeout": "suspend"}).json()
    p = f"/v1/sandboxes/{sb['id']}"
    assert sb["suspend_on_timeout"] is True and sb["pause_on_timeout"] is False
    alice.put(f"{p}/files/content", params={"path": "kept.txt"}, content=b"kept")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alice.get(p).json()["state"] != "suspended":
        time.sleep(0.2)
    assert alice.get(p).json()["state"] == "suspended"
    time.sleep(2)
    assert alice.get(p).json()["state"] == "suspended", "a suspended sandbox does not expire"
    assert alice.post(f"{p}/resume").json()["from_disk"] is True
    assert alice.post(f"{p}/commands/run", json={"script": "cat kept.txt"}).json()["stdout"] == "kept"
    alice.delete(p)


def test_on_timeout_pause_pauses_instead_of_destroying(alice):
    err(alice.post("/v1/sandboxes", json={"on_timeout": "sleep"}), 400, "invalid_argument", "on_timeout")
    sb = alice.post("/v1/sandboxes", json={"timeout_s": 1, "on_timeout": "pause"}).json()
    p = f"/v1/sandboxes/{sb['id']}"
    assert sb["pause_on_timeout"] is True and sb["state"] == "running"
    alice.put(f"{p}/files/content", params={"path": "kept.txt"}, content=b"kept")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alice.get(p).json()["state"] != "paused":
        time.sleep(0.2)
    assert alice.get(p).json()["state"] == "paused"
    err(alice.post(f"{p}/commands/run", json={"script": "echo no"}), 409, "sandbox_paused")
    time.sleep(2)
    assert alice.get(p).json()["state"] == "paused", "a paused sandbox does not expire"
    assert alice.post(f"{p}/resume").status_code == 200
    view = alice.get(p).json()
    assert view["state"] == "running" and view["expires_at_ms"] > time.time() * 1000, view
    assert alice.post(f"{p}/commands/run", json={"script": "cat kept.txt"}).json()["stdout"] == "kept"
    alice.delete(p)


def test_timeout_destroys_and_extend_keeps(alice):
    short = alice.post("/v1/sandboxes", json={"timeout_s": 1, "metadata": {"t": "short"}}).json()
    kept = alice.post("/v1/sandboxes", json={"timeout_s": 1, "metadata": {"t": "kept"}}).json()
    assert alice.post(f"/v1/sandboxes/{kept['id']}/timeout", json={"timeout_s": 60}).status_code == 200
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alice.get(f"/v1/sandboxes/{short['id']}").status_code == 200:
        time.sleep(0.2)
    err(alice.get(f"/v1/sandboxes/{short['id']}"), 404, "sandbox_not_found")
    r = alice.post(f"/v1/sandboxes/{kept['id']}/commands/run", json={"script": "echo alive"})
    assert r.json()["stdout"] == "alive\n"
    alice.delete(f"/v1/sandboxes/{kept['id']}")
    metrics = alice.get("/metrics").text
    assert 'namzu_sandbox_destroys_total{tier="local",reason="timeout"}' in metrics


def test_kill_9_mid_stream_then_reattach_gets_every_byte(fresh_server):
    s = fresh_server()
    with s.client() as c:
        sid = c.post("/v1/sandboxes", json={}).json()["id"]
        p = f"/v1/sandboxes/{sid}/commands"
        script = "i=0; while [ $i -lt 40 ]; do echo line-$i; i=$((i+1)); sleep 0.05; done; exit 9"
        got, last = b"", 0
        with c.stream("POST", p, json={"script": script, "execution_id": "survivor"}) as r:
            for line in r.iter_lines():
                ev = json.loads(line)
                if ev["type"] == "stdout":
                    got += base64.b64decode(ev["data"])
                    last = ev["next_offset"]
                    if got.count(b"\n") >= 5:
                        s.kill9()
                        break
    s.start()
    with s.client() as c:
        with c.stream("GET", f"{p}/survivor/events", params={"offset": last}) as r:
            evs = [json.loads(x) for x in r.iter_lines() if x]
    got += b"".join(base64.b64decode(e["data"]) for e in evs if e["type"] == "stdout")
    assert got == b"".join(b"line-%d\n" % i for i in range(40)), "every byte, once"
    assert evs[-1]["type"] == "exit" and evs[-1]["status"]["code"] == 9


def test_sigterm_ends_streams_within_the_grace_and_keeps_sandboxes(fresh_server):
    s = fresh_server("--shutdown-grace", "1")
    with s.client() as c:
        sid = c.post("/v1/sandboxes", json={}).json()["id"]
        p = f"/v1/sandboxes/{sid}/commands"
        with c.stream("POST", p, json={"script": "echo begun; sleep 5; echo finished", "execution_id": "slow"}) as r:
            lines = r.iter_lines()
            assert json.loads(next(lines))["type"] == "start"
            assert json.loads(next(lines))["type"] == "stdout"
            started = time.monotonic()
            s.proc.send_signal(15)
            rest = [json.loads(x) for x in lines if x]
        assert rest[-1]["type"] == "error" and rest[-1]["code"] == "server_shutting_down", rest
        assert s.proc.wait(10) == 0
        assert time.monotonic() - started < 4, "the grace bounds the shutdown"
    s.start()
    with s.client() as c:
        with c.stream("GET", f"{p}/slow/events", params={"offset": rest[-1]["next_offset"]}) as r:
            evs = [json.loads(x) for x in r.iter_lines() if x]
        assert b"".join(base64.b64decode(e["data"]) for e in evs if e["type"] == "stdout") == b"finished\n"
        assert c.post(f"{p}/run", json={"script": "echo kept"}).json()["stdout"] == "kept\n"


def test_warm_pool_serves_default_creates_and_leaves_nothing_behind(fresh_server):
    s = fresh_server("--warm-pool", "2")
    ledger = s.state_dir / "state" / "server" / "pool" / "local-default"
    local = s.state_dir / "state" / "local"

    def pooled():
        return sorted(p.name for p in ledger.iterdir()) if ledger.is_dir() else []

    def running():
        return sorted(p.name for p in local.iterdir() if p.name.startswith("sb-")) if local.is_dir() else []

    def wait_for(pred, what):
        deadline = time.monotonic() + 60
        while not pred():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    wait_for(lambda: len(pooled()) == 2, "the pool did not fill")
    waiting = pooled()
    with s.client() as c:
        warm = c.post("/v1/sandboxes", json={}).json()["id"]
        assert warm in waiting, "a default create is served from the pool"
        assert warm not in pooled(), "a claimed sandbox leaves the ledger"
        assert c.post(f"/v1/sandboxes/{warm}/commands/run", json={"script": "echo warm"}).json()["stdout"] == "warm\n"
        cold = c.post("/v1/sandboxes", json={"env": {"A": "1"}}).json()["id"]
        assert cold not in waiting, "a create asking for more starts cold"
        wait_for(lambda: len(pooled()) == 2, "the pool did not refill")
        left = pooled()
        # A server killed outright leaves its pool's sandboxes running: the
        # next one destroys them before it fills again.
        s.kill9()
        assert set(left) <= set(running())
        s.start()
        wait_for(lambda: not (set(left) & set(running())), "the old pool's sandboxes survived the restart")
        wait_for(lambda: len(pooled()) == 2, "the restarted pool did not fill")
    # A clean shutdown destroys the pool's own and keeps the callers'.
    refilled = pooled()
    assert s.stop() == 0
    assert not (set(refilled) & set(running())), "a clean shutdown left pooled sandboxes"
    assert {warm, cold} <= set(running()), "the callers' sandboxes are kept"
    s.start()
    with s.client() as c:
        for sid in (warm, cold):
            assert c.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)
    assert s.stop() == 0
    assert running() == [], "sandboxes outlived the test"


def test_open_listener_without_keys_is_refused():
    r = subprocess.run([namzu_bin(), "serve", "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 125
    assert "--api-keys" in r.stderr and "0.0.0.0" in r.stderr


# ---- HTTP/2, TLS


def test_h2c_and_tls_with_h2(fresh_server, tmp_path):
    s = fresh_server()
    r = subprocess.run(
        ["curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_version} %{http_code}", f"{s.url}/v1/health"],
        capture_output=True, text=True, timeout=30,
    )
    assert r.stdout == "2 200", (r.stdout, r.stderr)
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True, timeout=60,
    )
    t = fresh_server("--tls-cert", str(cert), "--tls-key", str(key))
    assert t.url.startswith("https://")
    r = subprocess.run(
        ["curl", "-sS", "--cacert", str(cert), "-o", "-", "-w", " %{http_version}", t.url.replace("127.0.0.1", "localhost") + "/v1/health"],
        capture_output=True, text=True, timeout=30,
    )
    assert r.stdout.endswith(" 2") and '"ok"' in r.stdout, (r.stdout, r.stderr)


# ---- metrics and the contract


def test_metrics_count_what_happened(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}"
    alice.post(f"{p}/commands/run", json={"script": "echo metrics"})
    alice.put(f"{p}/files/content", params={"path": "m.bin"}, content=b"m" * 1000)
    text = alice.get("/metrics").text
    for needle in (
        'namzu_sandboxes{tier="local",state="running"}',
        'namzu_sandbox_creates_total{tier="local"}',
        'namzu_sandbox_create_seconds_bucket{le="0.001",tier="local"}',
        'namzu_commands_total{tier="local"}',
        'namzu_command_seconds_count{tier="local"}',
        'namzu_bytes_total{direction="upload"}',
        'namzu_http_requests_total{route="/v1/sandboxes/{id}/commands/run",method="POST",status="200"}',
    ):
        assert needle in text, needle
    up = next(l for l in text.splitlines() if l.startswith('namzu_bytes_total{direction="upload"}'))
    assert float(up.split()[-1]) >= 1000


def test_egress_decisions_are_counted_by_verdict(alice):
    def egress():
        text = alice.get("/metrics").text
        return {
            l.split('verdict="')[1].split('"')[0]: float(l.split()[-1])
            for l in text.splitlines()
            if l.startswith("namzu_egress_decisions{")
        }

    sb = alice.post("/v1/sandboxes", json={"network": {"mode": "allowlist", "allow": [{"host": "example.com"}]}}).json()
    try:
        before = egress().get("refused", 0)
        r = alice.post(f"/v1/sandboxes/{sb['id']}/commands/run", json={"script": "getent hosts blocked.test; getent hosts other.test; true"})
        assert r.status_code == 200
        after = egress()
        assert after["refused"] >= before + 2, (before, after)
        assert after["allowed"] == 0
    finally:
        alice.delete(f"/v1/sandboxes/{sb['id']}")


def test_openapi_is_served_committed_and_valid(alice):
    from openapi_spec_validator import validate

    served = alice.get("/v1/openapi.json")
    assert served.status_code == 200
    committed = (ROOT / "crates/namzu-server/openapi.json").read_text()
    assert served.text == committed, "the served document is the committed one"
    doc = json.loads(committed)
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_watch_a_directory(alice, sandbox):
    p = f"/v1/sandboxes/{sandbox['id']}/files"
    alice.post(f"{p}/mkdir", json={"path": "watched"})
    with alice.stream("GET", f"{p}/watch", params={"path": "watched"}) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = r.iter_lines()
        assert json.loads(next(lines)) == {"type": "started", "name": "", "is_dir": True}
        alice.put(f"{p}/content", params={"path": "watched/a.txt"}, content=b"1")
        alice.post(f"{p}/rename", json={"from": "watched/a.txt", "to": "outside.txt"})
        got = []
        for line in lines:
            got.append(json.loads(line))
            if got[-1]["type"] == "rename":
                break
    kinds = [(e["type"], e["name"]) for e in got]
    # The atomic write shows as its rename into place (namzu's temporary is
    # not reported); the move out as a rename.
    assert kinds == [("create", "a.txt"), ("rename", "a.txt")], kinds
    err(alice.get(f"{p}/watch", params={"path": "nope"}), 404, "file_not_found", "path")
    err(alice.get(f"{p}/watch", params={"path": "../.."}), 400, "path_escape", "path")


def test_connections_past_max_connections_wait_their_turn(fresh_server):
    s = fresh_server("--max-connections", "1")
    host, port = s.url.split("://")[1].rsplit(":", 1)
    first = socket.create_connection((host, int(port)))
    first.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert first.recv(4096).startswith(b"HTTP/1.1 200"), "the first connection is served (and kept alive)"
    second = socket.create_connection((host, int(port)))  # the kernel's backlog accepts it
    second.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    second.settimeout(1.0)
    with pytest.raises(socket.timeout):
        second.recv(4096)
    first.close()  # its slot frees: the second is served now
    second.settimeout(10)
    assert second.recv(4096).startswith(b"HTTP/1.1 200")
    second.close()
