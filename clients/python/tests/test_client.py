"""The Python client against a live ``namzu serve`` on the local tier."""

from __future__ import annotations

import asyncio
import io
import os

import pytest

import namzu


@pytest.fixture
def client(server):
    with namzu.Client(server.url, api_key=server.keys["alice"]) as c:
        yield c


def test_context_manager_destroys_the_sandbox(client):
    with client.create(metadata={"case": "ctx"}) as sb:
        r = sb.run("echo hello; echo oops >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"hello\n", b"oops\n")
        sid = sb.id
    with pytest.raises(namzu.NamzuError) as e:
        client.get(sid)
    assert (e.value.status, e.value.code) == (404, "sandbox_not_found")


def test_argv_env_cwd_stdin_and_binary_output(client):
    with client.create(env={"BASE": "1"}) as sb:
        sb.mkdir("/workspace/d", parents=True)
        r = sb.run(["sh", "-c", 'printf "%s %s " "$BASE" "$X"; pwd; cat'], env={"X": "2"}, cwd="/workspace/d", stdin=b"in\n")
        assert r.stdout == b"1 2 /workspace/d\nin\n"
        r = sb.run(["sh", "-c", "printf '\\377\\000\\001'"])
        assert r.stdout == b"\xff\x00\x01", "non-UTF-8 output survives"


def test_stream_yields_ordered_chunks_with_offsets_and_exit(client):
    with client.create() as sb:
        s = sb.stream("for i in 1 2 3; do echo o$i; echo e$i >&2; done; exit 5")
        events = list(s)
        out = b"".join(e.data for e in events if isinstance(e, namzu.Output) and e.stream == "stdout")
        err = b"".join(e.data for e in events if isinstance(e, namzu.Output) and e.stream == "stderr")
        assert (out, err) == (b"o1\no2\no3\n", b"e1\ne2\ne3\n")
        last = events[-1]
        assert isinstance(last, namzu.Exit) and last.status.code == 5
        assert last.next_offset == len(out) + len(err) == s.next_offset
        assert s.execution_id


def test_spawn_attach_by_offset_and_cancel(client):
    with client.create() as sb:
        eid = sb.spawn("for i in 1 2 3 4; do echo line$i; done; sleep 0.3; echo end", execution_id="job-a")
        assert eid == "job-a"
        whole = sb.attach(eid).collect()
        assert whole.stdout == b"line1\nline2\nline3\nline4\nend\n"
        tail = sb.attach(eid, offset=12).collect()
        assert tail.stdout == whole.stdout[12:], "re-attach from an offset gets exactly the rest"
        long = sb.spawn(["sleep", "60"])
        assert any(e.execution_id == long and e.state == "running" for e in sb.commands())
        assert sb.cancel(long) == "killed"
        ex = {e.execution_id: e for e in sb.commands()}
        assert ex[long].state == "exited"


def test_files_as_bytes_and_streams(client, tmp_path):
    with client.create() as sb:
        data = os.urandom(3 << 20)
        assert sb.write("/workspace/big.bin", io.BytesIO(data)) == len(data)
        assert sb.read("/workspace/big.bin") == data
        assert sb.read("/workspace/big.bin", offset=100, length=50) == data[100:150]
        assert b"".join(sb.read_stream("/workspace/big.bin")) == data
        sb.write("/workspace/t/x.txt", "hi", create_parents=True, mode=0o600)
        st = sb.stat("/workspace/t/x.txt")
        assert (st.kind, st.size, st.mode & 0o777) == ("file", 2, 0o600)
        sb.rename("/workspace/t/x.txt", "/workspace/t/y.txt")
        assert [f.name for f in sb.list_dir("/workspace/t")] == ["y.txt"]
        assert {f.name for f in sb.walk("/workspace")} >= {"big.bin", "t", "y.txt"}
        sb.remove("/workspace/t", recursive=True)
        with pytest.raises(namzu.NamzuError) as e:
            sb.stat("/workspace/t")
        assert (e.value.status, e.value.code) == (404, "file_not_found")


def test_list_pages_and_filters(client):
    made = [client.create(metadata={"group": "pages", "n": str(i)}) for i in range(5)]
    try:
        ids = [s.id for s in client.list(metadata={"group": "pages"}, page_size=2)]
        assert sorted(ids) == sorted(s.id for s in made)
        assert [s.id for s in client.list(metadata={"group": "pages", "n": "3"})] == [made[3].id]
    finally:
        for s in made:
            s.destroy()


def test_set_timeout_extends(client):
    with client.create(timeout_s=30) as sb:
        before = sb.info.expires_at_ms
        after = sb.set_timeout(3600).expires_at_ms
        assert after - before > 3000 * 1000


def test_async_client(server):
    async def main():
        async with namzu.AsyncClient(server.url, api_key=server.keys["alice"]) as c:
            async with await c.create(metadata={"case": "async"}) as sb:
                r = await sb.run("echo async")
                assert r.stdout == b"async\n"
                chunks = [ev async for ev in sb.stream(["sh", "-c", "echo a; echo b"])]
                assert b"".join(e.data for e in chunks if isinstance(e, namzu.Output)) == b"a\nb\n"
                assert await sb.write("f.txt", b"abc") == 3
                assert await sb.read("f.txt") == b"abc"
                eid = await sb.spawn("echo later", execution_id="later")
                got = [ev async for ev in sb.attach(eid)]
                assert isinstance(got[-1], namzu.Exit) and got[-1].status.success
                assert [s.id async for s in c.list(metadata={"case": "async"})] == [sb.id]

    asyncio.run(main())
