"""Snapshots and forks through the HTTP API, against a live ``namzu serve``
on the microvm tier (qemu under TCG here), with httpx as the client: a
snapshot of a running sandbox lets it run on; a fork is the caller's, goes
on from the snapshot's instant and is recorded like any sandbox; another
key sees none of it; removal is refused while a fork runs. Skipped where
the tier cannot run (no NAMZU_MICROVM_KERNEL, no image), unless
NAMZU_REQUIRE_MICROVM=1."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time

import pytest

from conftest import ROOT, Server, cleanup, make_keys, namzu_bin

IMAGE_TAR = ROOT / "target/images/debian-bookworm.tar"
IMAGE = "debian:bookworm"


def _missing() -> str | None:
    if not os.environ.get("NAMZU_MICROVM_KERNEL"):
        return "NAMZU_MICROVM_KERNEL is not set (scripts/microvm-up.sh prints it)"
    if not IMAGE_TAR.is_file():
        return f"{IMAGE_TAR} is missing (scripts/images.sh)"
    return None


@pytest.fixture(scope="module")
def vm_server():
    why = _missing()
    if why:
        if os.environ.get("NAMZU_REQUIRE_MICROVM") == "1":
            pytest.fail(f"microvm required but unavailable: {why}")
        pytest.skip(why)
    # Kept across runs beside the other microvm state (the image imported
    # and its base disk built once); short, for the sockets beneath it.
    state = ROOT / "target/microvm/http"
    (state / "state").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NAMZU_STATE_DIR=str(state / "state"))
    listed = subprocess.run([namzu_bin(), "image", "ls"], env=env, capture_output=True, text=True, check=True)
    if IMAGE not in listed.stdout:
        subprocess.run([namzu_bin(), "image", "import", str(IMAGE_TAR), "--name", IMAGE], env=env, check=True)
    s = Server(state, make_keys(), ["--tiers", "microvm"]).start()
    yield s
    try:
        with s.client("alice") as c:
            for snap in c.get("/v1/snapshots").json().get("snapshots", []):
                c.delete(f"/v1/snapshots/{snap['id']}")
        cleanup(s)
    finally:
        s.stop()


def err(r, status, code):
    assert r.status_code == status, (r.status_code, r.text)
    assert r.json()["code"] == code, r.text


def test_snapshot_fork_and_remove_over_http(vm_server):
    alice, bob = vm_server.client("alice"), vm_server.client("bob")
    r = alice.post("/v1/sandboxes", json={"tier": "microvm", "image": IMAGE, "resources": {"memory_bytes": 268435456}})
    assert r.status_code == 201, r.text
    src = r.json()
    p = f"/v1/sandboxes/{src['id']}"
    assert alice.post(f"{p}/commands/run", json={"script": "echo before > /workspace/f"}).status_code == 200
    # A counter in a process's memory only, read back through a file it
    # writes when asked: what a fork has is the snapshot's memory.
    script = "n=0; while :; do n=$((n+1)); [ -e /tmp/ask ] && { echo $n > /tmp/told; rm /tmp/ask; }; sleep 0.05; done"
    r = alice.post(f"{p}/commands", json={"script": script, "execution_id": "counter", "detached": True})
    assert r.status_code == 201, r.text
    time.sleep(1)

    r = alice.post(f"{p}/snapshot")
    assert r.status_code == 201, r.text
    snap = r.json()
    assert snap["source"] == src["id"] and snap["tier"] == "microvm" and snap["memory_bytes"] > 1 << 20, snap
    assert [s["id"] for s in alice.get("/v1/snapshots").json()["snapshots"]] == [snap["id"]]
    assert bob.get("/v1/snapshots").json()["snapshots"] == []
    err(bob.post(f"/v1/snapshots/{snap['id']}/fork"), 404, "snapshot_not_found")
    err(bob.delete(f"/v1/snapshots/{snap['id']}"), 404, "snapshot_not_found")

    r = alice.post(f"/v1/snapshots/{snap['id']}/fork", json={"timeout_s": 600})
    assert r.status_code == 201, r.text
    fork = r.json()
    fp = f"/v1/sandboxes/{fork['id']}"
    assert fork["id"] != src["id"] and fork["state"] == "running", fork
    assert alice.get(fp).status_code == 200
    err(bob.get(fp), 404, "sandbox_not_found")
    # The fork's counter runs on from the snapshot's memory.
    r = alice.post(f"{fp}/commands/run", json={"script": "touch /tmp/ask; while [ ! -e /tmp/told ]; do sleep 0.1; done; cat /tmp/told /workspace/f"})
    told, f = r.json()["stdout"].split()
    assert int(told) > 1 and f == "before", r.text
    # Its disk is its own.
    alice.post(f"{fp}/commands/run", json={"script": "echo fork > /workspace/f"})
    assert alice.post(f"{p}/commands/run", json={"script": "cat /workspace/f"}).json()["stdout"] == "before\n"

    err(alice.delete(f"/v1/snapshots/{snap['id']}"), 409, "snapshot_in_use")
    assert alice.delete(fp).status_code in (200, 204)
    assert alice.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
    assert alice.get("/v1/snapshots").json()["snapshots"] == []
    err(alice.post(f"/v1/snapshots/{snap['id']}/fork"), 404, "snapshot_not_found")
    alice.delete(p)


def test_a_paused_vm_refuses_work_and_resumes_after_a_server_restart(vm_server):
    """A pause stops the whole VM: commands and snapshots get 409
    ``sandbox_paused``; a detached command begun before it ends after the
    resume with its whole output, even when the server that paused it was
    restarted meanwhile (the new one cannot connect to a paused VM and
    continues it through the tier)."""
    alice = vm_server.client("alice")
    r = alice.post("/v1/sandboxes", json={"tier": "microvm", "image": IMAGE, "resources": {"memory_bytes": 268435456}})
    assert r.status_code == 201, r.text
    p = f"/v1/sandboxes/{r.json()['id']}"
    script = "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i; sleep 0.1; done"
    r = alice.post(f"{p}/commands", json={"script": script, "execution_id": "count", "detached": True})
    assert r.status_code == 201, r.text
    r = alice.post(f"{p}/pause")
    assert r.status_code == 200, r.text
    assert r.json() == {"stopped": [], "rounds": 1}, r.text
    err(alice.post(f"{p}/commands/run", json={"script": "true"}), 409, "sandbox_paused")
    err(alice.post(f"{p}/snapshot"), 409, "sandbox_paused")
    assert alice.get(p).json()["state"] == "paused"

    vm_server.stop()
    vm_server.start()
    alice = vm_server.client("alice")
    err(alice.post(f"{p}/commands/run", json={"script": "true"}), 409, "sandbox_paused")
    r = alice.post(f"{p}/resume")
    assert r.status_code == 200, r.text
    assert alice.get(p).json()["state"] == "running"
    with alice.stream("GET", f"{p}/commands/count/events", params={"offset": 0}) as r:
        assert r.status_code == 200
        evs = [json.loads(x) for x in r.iter_lines() if x]
    out = b"".join(base64.b64decode(e["data"]) for e in evs if e["type"] == "stdout")
    assert out.decode() == "".join(f"{i}\n" for i in range(1, 41))
    assert evs[-1]["type"] == "exit" and evs[-1]["status"]["code"] == 0, evs[-1]
    assert alice.delete(p).status_code == 204
