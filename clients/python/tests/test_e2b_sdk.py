"""The unmodified E2B SDK (`e2b` from PyPI) against `namzu serve`: the three
environment variables point it at the server, and E2B code runs as it is."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest

import e2b  # noqa: E402  (the test command installs e2b==2.63.0)
from e2b import AsyncSandbox, Sandbox  # noqa: E402
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException  # noqa: E402


@pytest.fixture
def e2b_env(server, monkeypatch):
    env = {"E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_API_KEY": server.keys["alice"]}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def sbx(e2b_env):
    sb = Sandbox.create(metadata={"suite": "e2b"})
    yield sb
    sb.kill()


def test_run_output_exit_codes_env_and_cwd(sbx):
    r = sbx.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(e2b.CommandExitException) as e:
        sbx.commands.run("echo partial; exit 7")
    assert (e.value.exit_code, e.value.stdout) == (7, "partial\n")
    sbx.files.make_dir("/workspace/here")
    r = sbx.commands.run('echo "$GREETING from $(pwd)"', envs={"GREETING": "hi"}, cwd="/workspace/here")
    assert r.stdout == "hi from /workspace/here\n"


def test_background_wait_list_kill_and_connect(sbx):
    h = sbx.commands.run("echo started; sleep 1; echo done", background=True)
    assert h.pid > 0
    assert any(p.pid == h.pid for p in sbx.commands.list())
    res = h.wait()
    assert res.stdout == "started\ndone\n" and res.exit_code == 0
    long = sbx.commands.run("sleep 60", background=True)
    again = sbx.commands.connect(long.pid)
    assert sbx.commands.kill(long.pid) is True
    with pytest.raises(e2b.CommandExitException):
        again.wait()
    assert all(p.pid != long.pid for p in sbx.commands.list())


def test_a_background_command_survives_the_sdk_closing_its_stream(sbx, e2b_env):
    h = sbx.commands.run("for i in 1 2 3 4 5; do echo tick$i; sleep 0.4; done", background=True)
    h.disconnect()
    script = (
        "import sys; from e2b import Sandbox\n"
        f"sb = Sandbox.connect({sbx.sandbox_id!r})\n"
        f"print(sb.commands.connect({h.pid}).wait().stdout, end='')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **e2b_env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"tick{i}\n" for i in range(1, 6)), "re-attached from a second process, every line"


def test_stdin(sbx):
    h = sbx.commands.run("cat; echo end", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "line one\n")
    sbx.commands.send_stdin(h.pid, b"line two\n")
    sbx.commands.stream_input(h.pid, iter(["line three\n", b"line four\n"]))
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "line one\nline two\nline three\nline four\nend\n"


def test_files(sbx):
    fs = sbx.files
    info = fs.write("/workspace/t.txt", "text")
    assert info.path == "/workspace/t.txt"
    assert fs.read("/workspace/t.txt") == "text"
    fs.write("/workspace/b.bin", b"\x00\xffbytes")
    assert bytes(fs.read("/workspace/b.bin", format="bytes")) == b"\x00\xffbytes"
    assert b"".join(fs.read("/workspace/b.bin", format="stream")) == b"\x00\xffbytes"
    assert fs.make_dir("/workspace/d/e") is True
    assert fs.make_dir("/workspace/d/e") is False
    fs.write("/workspace/d/e/f.txt", "deep")
    shallow = {e.name for e in fs.list("/workspace")}
    assert shallow == {"t.txt", "b.bin", "d"}
    deep = {e.path for e in fs.list("/workspace", depth=3)}
    assert "/workspace/d/e/f.txt" in deep
    assert fs.exists("/workspace/d/e/f.txt") and not fs.exists("/workspace/nope")
    moved = fs.rename("/workspace/t.txt", "/workspace/u.txt")
    assert moved.name == "u.txt" and not fs.exists("/workspace/t.txt")
    st = fs.get_info("/workspace/u.txt")
    assert (st.size, st.type.value) == (4, "file")
    fs.remove("/workspace/d")
    assert not fs.exists("/workspace/d")
    with pytest.raises(e2b.FileNotFoundException):
        fs.read("/workspace/nope")


def test_a_100_mib_file_round_trips_byte_exact(sbx, tmp_path):
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for i in range(100):
            f.write(os.urandom(1 << 20))
    with open(src, "rb") as f:
        sbx.files.write("/workspace/big.bin", f)
    got = tmp_path / "back.bin"
    with open(got, "wb") as f:
        for chunk in sbx.files.read("/workspace/big.bin", format="stream"):
            f.write(chunk)
    assert got.stat().st_size == 100 << 20
    assert subprocess.run(["cmp", str(src), str(got)]).returncode == 0


def test_list_info_timeout_and_kill(e2b_env):
    made = [Sandbox.create(metadata={"group": "e2b-list", "n": str(i)}) for i in range(3)]
    try:
        pager = Sandbox.list(query=e2b.SandboxQuery(metadata={"group": "e2b-list"}), limit=2)
        seen = []
        while pager.has_next:
            seen += [s.sandbox_id for s in pager.next_items()]
        assert sorted(seen) == sorted(s.sandbox_id for s in made)
        info = made[0].get_info()
        assert info.metadata == {"group": "e2b-list", "n": "0"} and info.template_id == "base"
        made[0].set_timeout(1)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and made[0].is_running():
            time.sleep(0.3)
        with pytest.raises(NotFoundException):
            Sandbox.connect(made[0].sandbox_id)
    finally:
        for s in made[1:]:
            assert s.kill() is True
    assert Sandbox.kill(made[1].sandbox_id) is False, "a second kill finds nothing"


def test_async_sandbox(e2b_env):
    from e2b import PtySize

    async def main():
        sb = await AsyncSandbox.create(metadata={"suite": "async"})
        try:
            r = await sb.commands.run("echo async-hello")
            assert r.stdout == "async-hello\n"
            await sb.files.make_dir("/workspace/ad")
            r = await sb.commands.run('echo "$X in $(pwd)"', envs={"X": "x"}, cwd="/workspace/ad")
            assert r.stdout == "x in /workspace/ad\n"
            with pytest.raises(e2b.CommandExitException) as e:
                await sb.commands.run("echo no >&2; exit 4")
            assert (e.value.exit_code, e.value.stderr) == (4, "no\n")
            await sb.files.write("/workspace/a.txt", "A")
            assert await sb.files.read("/workspace/a.txt") == "A"
            assert await sb.files.exists("/workspace/a.txt")
            await sb.files.rename("/workspace/a.txt", "/workspace/ad/b.txt")
            assert {e.name for e in await sb.files.list("/workspace", depth=2)} == {"ad", "b.txt"}
            await sb.files.remove("/workspace/ad")
            assert not await sb.files.exists("/workspace/ad")
            h = await sb.commands.run("sleep 0.3; echo bg", background=True)
            assert (await h.wait()).stdout == "bg\n"
            fed = await sb.commands.run("cat", background=True, stdin=True)
            await sb.commands.send_stdin(fed.pid, "fed\n")
            await sb.commands.close_stdin(fed.pid)
            assert (await fed.wait()).stdout == "fed\n"
            long = await sb.commands.run("sleep 60", background=True)
            assert any(p.pid == long.pid for p in await sb.commands.list())
            assert await sb.commands.kill(long.pid) is True
            out = bytearray()
            t = await sb.pty.create(PtySize(rows=24, cols=80), on_data=lambda d: out.extend(d))
            await sb.pty.send_stdin(t.pid, b"echo tty-$((2+3)); exit 0\n")
            await t.wait()
            assert b"tty-5" in out, bytes(out)
            await sb.set_timeout(120)
            info = await sb.get_info()
            assert info.metadata == {"suite": "async"}
            listed = await AsyncSandbox.list(query=e2b.SandboxQuery(metadata={"suite": "async"})).next_items()
            assert [x.sandbox_id for x in listed] == [sb.sandbox_id]
        finally:
            await sb.kill()

    asyncio.run(main())


def test_bad_keys_unknown_ids_templates_and_tokens(server, e2b_env, monkeypatch, sbx):
    with pytest.raises(NotFoundException):
        Sandbox.connect("sb-000000000000")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(template="no-such-template")
    assert "no-such-template" in str(e.value)
    monkeypatch.setenv("E2B_API_KEY", "nz_" + "0" * 64)
    with pytest.raises(AuthenticationException):
        Sandbox.create()
    # Another key's sandbox does not exist for it.
    monkeypatch.setenv("E2B_API_KEY", server.keys["bob"])
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    # envd without the sandbox's access token.
    r = httpx.post(
        f"{server.url}/process.Process/List",
        json={},
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"},
    )
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    r = httpx.post(
        f"{server.url}/process.Process/List",
        json={},
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": "wrong"},
    )
    assert r.status_code == 401


UPGRADE_ECHO = r'''
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8081)); s.listen()
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d[::-1])
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,)).start()
'''


WS_ECHO = r'''
import base64, hashlib, socket, struct, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8082)); s.listen()
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d: raise EOFError
        b += d
    return b
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    key = [l.split(b": ", 1)[1] for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    try:
        while True:
            b0, b1 = recv_exact(c, 2)
            n = b1 & 127
            if n == 126: n = struct.unpack(">H", recv_exact(c, 2))[0]
            elif n == 127: n = struct.unpack(">Q", recv_exact(c, 8))[0]
            mask = recv_exact(c, 4)
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(recv_exact(c, n)))
            if b0 & 15 == 8: break
            reply = ("echo:" + data.decode()).encode()
            c.sendall(bytes([0x81, len(reply)]) + reply)
    except EOFError:
        pass
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,)).start()
'''


def test_a_websocket_inside_the_sandbox_through_the_server(server, sbx):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    sbx.files.write("/workspace/ws.py", WS_ECHO)
    sbx.commands.run("python3 /workspace/ws.py", background=True)
    hdr = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8082", "E2b-Traffic-Access-Token": sbx.traffic_access_token}
    url = server.url.replace("http://", "ws://") + "/chat"
    for _ in range(100):
        try:
            ws = connect(url, additional_headers=hdr)
            break
        except InvalidStatus as e:
            assert e.response.status_code == 502
            time.sleep(0.1)
    with ws:
        ws.send("hi")
        assert ws.recv(timeout=10) == "echo:hi"
        ws.send("again")
        assert ws.recv(timeout=10) == "echo:again"


def test_a_port_inside_the_sandbox_is_reached_through_the_server(server, sbx):
    sbx.files.write("/workspace/www/index.html", "served from inside")
    sbx.commands.run("cd /workspace/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    sbx.commands.run(f"python3 -c '{UPGRADE_ECHO}'", background=True)
    hdr = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000", "E2b-Traffic-Access-Token": sbx.traffic_access_token}
    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{server.url}/index.html", headers=hdr)
        if r.status_code != 502 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (r.status_code, r.text) == (200, "served from inside")
    assert httpx.get(f"{server.url}/index.html", headers={**hdr, "E2b-Traffic-Access-Token": "no"}).status_code == 401
    # An upgraded connection (as a WebSocket is) is spliced both ways.
    import socket

    host, port = server.url.split("://")[1].rsplit(":", 1)
    for _ in range(100):
        s = socket.create_connection((host, int(port)))
        s.sendall(
            (
                f"GET /chat HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {sbx.sandbox_id}\r\nE2b-Sandbox-Port: 8081\r\n"
                f"E2b-Traffic-Access-Token: {sbx.traffic_access_token}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        if head.startswith(b"HTTP/1.1 101"):
            break
        s.close()
        time.sleep(0.2)
    assert head.startswith(b"HTTP/1.1 101"), head
    s.sendall(b"hello sandbox")
    got = b""
    while len(got) < 13:
        got += s.recv(100)
    assert got == b"xobdnas olleh"
    s.close()


def test_pty_create_input_resize_and_wait(sbx):
    from e2b import PtySize

    h = sbx.pty.create(PtySize(rows=24, cols=80))
    assert h.pid > 0
    assert any(p.pid == h.pid for p in sbx.commands.list())
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((6*7)); exit 5\n")
    out = bytearray()
    code = None
    try:
        h.wait(on_pty=lambda d: out.extend(d))
        code = 0
    except e2b.CommandExitException as e:
        code = e.exit_code
    assert code == 5
    assert b"30 100" in out and b"pty-42" in out, bytes(out)
    killed = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(killed.pid) is True


def test_signed_file_urls(sbx):
    sbx.files.write("/workspace/shared.txt", "signed content")
    url = sbx.download_url("/workspace/shared.txt", use_signature_expiration=60)
    assert "signature=v1_" in url
    r = httpx.get(url)
    assert (r.status_code, r.text) == (200, "signed content"), r.text
    assert httpx.get(url.replace("shared.txt", "other.txt")).status_code == 401, "the signature covers the path"
    up = sbx.upload_url("/workspace/uploaded.txt")
    r = httpx.post(up, files={"file": ("uploaded.txt", b"via a signed url")})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/workspace/uploaded.txt") == "via a signed url"
    expired = sbx.download_url("/workspace/shared.txt", use_signature_expiration=-10)
    assert httpx.get(expired).status_code == 401


def test_watch_dir_sync_polling(sbx):
    sbx.files.make_dir("/workspace/w")
    handle = sbx.files.watch_dir("/workspace/w", recursive=True)
    sbx.files.write("/workspace/w/new.txt", "x")
    sbx.files.make_dir("/workspace/w/sub")
    time.sleep(0.3)
    sbx.files.write("/workspace/w/sub/deep.txt", "y")
    sbx.files.remove("/workspace/w/new.txt")
    deadline, seen = time.monotonic() + 10, []
    while time.monotonic() < deadline:
        seen += [(e.name, e.type.name) for e in handle.get_new_events()]
        if ("new.txt", "REMOVE") in seen and ("sub/deep.txt", "CREATE") in seen:
            break
        time.sleep(0.2)
    handle.stop()
    assert ("new.txt", "CREATE") in seen and ("new.txt", "REMOVE") in seen, seen
    assert ("sub", "CREATE") in seen and ("sub/deep.txt", "CREATE") in seen, seen


def test_watch_dir_async_streaming(e2b_env):
    async def main():
        sb = await AsyncSandbox.create()
        try:
            await sb.files.make_dir("/workspace/aw")
            got = []
            done = asyncio.Event()

            def on_event(e):
                got.append((e.name, e.type.name))
                if ("b.txt", "CREATE") in got:
                    done.set()

            handle = await sb.files.watch_dir("/workspace/aw", on_event)
            await sb.files.write("/workspace/aw/a.txt", "1")
            await sb.files.write("/workspace/aw/b.txt", "2")
            await asyncio.wait_for(done.wait(), 10)
            await handle.stop()
            assert ("a.txt", "CREATE") in got and ("b.txt", "CREATE") in got, got
        finally:
            await sb.kill()

    asyncio.run(main())


def test_users_the_sdk_names_and_others_refused(sbx):
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    assert sbx.commands.run("id -u", user="user").stdout == "0\n", "one identity: uid 0 in the sandbox's namespace"
    with pytest.raises(e2b.InvalidArgumentException) as e:
        sbx.commands.run("id -u", user="alice")
    assert "alice" in str(e.value)


def test_large_bytes_go_through_multipart(sbx):
    data = os.urandom(3 << 20)  # bytes: the SDK sends multipart/form-data
    sbx.files.write("/workspace/m.bin", data)
    assert bytes(sbx.files.read("/workspace/m.bin", format="bytes")) == data
    sbx.files.write_files([{"path": "/workspace/one.txt", "data": "1"}, {"path": "/workspace/two.txt", "data": b"2"}])
    assert (sbx.files.read("/workspace/one.txt"), sbx.files.read("/workspace/two.txt")) == ("1", "2")


def test_options_namzu_cannot_honour_are_refused_by_name(server, e2b_env):
    base = {"templateID": "base"}
    for extra, name in (
        ({"autoResume": {"enabled": True}}, "autoPause"),
        ({"autoPause": True, "autoPauseMemory": False}, "autoPauseMemory"),
        ({"iam": {"roles": ["x"]}}, "iam"),
        ({"volumeMounts": [{"name": "v", "path": "/data"}]}, "volumeMounts"),
        ({"mcp": {"x": {}}}, "mcp"),
    ):
        r = httpx.post(f"{server.url}/v2/sandboxes", json={**base, **extra}, headers={"X-API-KEY": server.keys["alice"]})
        assert r.status_code == 400 and name in r.json()["message"], (name, r.status_code, r.text)
    sid = Sandbox.create().sandbox_id
    try:
        for route, body, name in (
            ("v2/sandboxes/{}/connect", {"timeout": 60, "memory": False}, "memory"),
            ("sandboxes/{}/resume", {"timeout": 60, "autoPause": True}, "autoPause"),
        ):
            r = httpx.post(f"{server.url}/{route.format(sid)}", json=body, headers={"X-API-KEY": server.keys["alice"]})
            assert r.status_code == 400 and name in r.json()["message"], (name, r.status_code, r.text)
    finally:
        Sandbox.kill(sid)
    with pytest.raises(e2b.SandboxException) as e:
        Sandbox.create(lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    assert "autoPauseMemory" in str(e.value), str(e.value)


def test_pause_then_connect_resumes_where_it_was(e2b_env):
    sbx = Sandbox.create()
    try:
        h = sbx.commands.run("for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.3; done", background=True)
        sbx.files.write("/workspace/before.txt", "disk")
        assert sbx.pause() is True
        assert sbx.pause() is False, "a second pause is E2B's 409"
        paused = [s.sandbox_id for s in Sandbox.list(query=e2b.SandboxQuery(state=[e2b.SandboxState.PAUSED])).next_items()]
        assert sbx.sandbox_id in paused
        running = [s.sandbox_id for s in Sandbox.list(query=e2b.SandboxQuery(state=[e2b.SandboxState.RUNNING])).next_items()]
        assert sbx.sandbox_id not in running
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("cat /workspace/before.txt").stdout == "disk"
        assert again.commands.connect(h.pid).wait().stdout == "".join(f"tick{i}\n" for i in range(1, 7))
    finally:
        sbx.kill()


def _wait_state(sbx, state):
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and sbx.get_info().state.value != state:
        time.sleep(0.2)
    return sbx.get_info().state.value


def test_a_timeout_pauses_and_the_next_request_resumes_with_auto_resume(e2b_env):
    sbx = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/workspace/kept.txt", "kept")
        assert _wait_state(sbx, "paused") == "paused"
        assert sbx.commands.run("cat /workspace/kept.txt").stdout == "kept", "the request resumed it"
        assert sbx.get_info().state.value == "running"
    finally:
        sbx.kill()


def test_a_timeout_pause_without_auto_resume_waits_for_connect(e2b_env):
    sbx = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause"})
    try:
        h = sbx.commands.run("sleep 2; echo woke", background=True)
        assert _wait_state(sbx, "paused") == "paused"
        assert not sbx.is_running(), "a paused sandbox's envd answers as not running"
        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.commands.connect(h.pid).wait().stdout == "woke\n"
    finally:
        sbx.kill()
