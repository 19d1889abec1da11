"""The same API on the docker tier, runc and gVisor (runsc): one sandbox
each, made, used and destroyed through `namzu serve --tiers local,docker`.
Skipped, with its reason, only where dockerd is not up and the run does not
require it (NAMZU_REQUIRE_DOCKER)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest

IMAGE = "namzu-api-test/busybox:1"


def docker_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def require_docker() -> None:
    """Fails where the run requires dockerd and it is down; skips, saying
    why, where it does not."""
    if not docker_up():
        if os.environ.get("NAMZU_REQUIRE_DOCKER"):
            pytest.fail("dockerd is not up and NAMZU_REQUIRE_DOCKER is set")
        pytest.skip("dockerd is not up (scripts/docker-up.sh starts it)")


@pytest.fixture(scope="module")
def image():
    require_docker()
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        # FROM scratch: Debian's static busybox as /bin/sh and its applets.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add("/bin/busybox", arcname="bin/busybox")
            for applet in ("sh", "echo", "cat", "uname", "sleep"):
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                t.addfile(link)
            for d in ("tmp", "workspace"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                t.addfile(info)
        subprocess.run(["docker", "import", "-c", "ENV PATH=/bin", "-", IMAGE], input=buf.getvalue(), check=True, capture_output=True)
    return IMAGE


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_a_docker_sandbox_through_the_api(fresh_server, image, runtime):
    s = fresh_server("--tiers", "local,docker")
    with s.client() as c:
        r = c.post("/v1/sandboxes", json={"tier": "docker", "image": image, "runtime": runtime, "metadata": {"rt": runtime}})
        assert r.status_code == 201, r.text
        sb = r.json()
        assert (sb["tier"], sb["runtime"], sb["image"]) == ("docker", runtime, image)
        p = f"/v1/sandboxes/{sb['id']}"
        cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=io.namzu.sandbox={sb['id']}"], capture_output=True, text=True).stdout.strip()
        used = subprocess.run(["docker", "inspect", "--format", "{{.HostConfig.Runtime}}", cid], capture_output=True, text=True).stdout.strip()
        assert used == runtime, (cid, used)
        try:
            out = c.post(f"{p}/commands/run", json={"script": "echo in-$(uname -s); echo err >&2; exit 4"}).json()
            assert (out["stdout"], out["stderr"], out["status"]["code"]) == ("in-Linux\n", "err\n", 4)
            assert c.put(f"{p}/files/content", params={"path": "/tmp/f"}, content=b"docker bytes").status_code == 200
            assert c.get(f"{p}/files/content", params={"path": "/tmp/f"}, headers={"Range": "bytes=7-"}).content == b"bytes"
            assert c.get(f"{p}/network").json()["policy"]["mode"] == "none"
        finally:
            assert c.delete(p).status_code == 204
        listed = [x["id"] for x in c.get("/v1/sandboxes").json()["sandboxes"]]
        assert sb["id"] not in listed
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=io.namzu.sandbox={sb['id']}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the container is gone"
