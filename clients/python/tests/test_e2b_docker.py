"""The unmodified E2B SDK on the docker tier (runc and gVisor), through a
template that maps to a docker image: `--e2b-template
bash=docker:namzu-api-test/bash:1`. The image holds the host's bash and its
libraries (the SDK runs commands with `/bin/bash -l -c`) and busybox."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest

import e2b  # noqa: E402  (the test command installs e2b==2.63.0)
from e2b import Sandbox  # noqa: E402

from test_docker_tier import require_docker

IMAGE = "namzu-api-test/bash:1"


def libs_of(binary: str):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            yield path


@pytest.fixture(scope="module")
def bash_image():
    require_docker()
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add("/bin/bash", arcname="bin/bash")
            for lib in libs_of("/bin/bash"):
                t.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
            t.add("/bin/busybox", arcname="bin/busybox")
            for applet in ("sh", "echo", "cat", "ls", "sleep", "mkdir", "rm", "uname"):
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                t.addfile(link)
            for d in ("tmp", "workspace", "home/user"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                t.addfile(info)
        subprocess.run(["docker", "import", "-c", "ENV PATH=/bin", "-", IMAGE], input=buf.getvalue(), check=True, capture_output=True)
    return IMAGE


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_the_e2b_sdk_on_the_docker_tier(fresh_server, bash_image, runtime, monkeypatch):
    args = ["--tiers", "local,docker", "--e2b-template", f"bash=docker:{bash_image}"]
    if runtime == "runsc":
        args = ["--tiers", "local,docker", "--e2b-template", f"bash=docker:{bash_image}", "--e2b-docker-runtime", "runsc"]
    s = fresh_server(*args)
    for k, v in {"E2B_API_URL": s.url, "E2B_SANDBOX_URL": s.url, "E2B_API_KEY": s.keys["alice"]}.items():
        monkeypatch.setenv(k, v)
    with Sandbox.create(template="bash") as sb:
        r = sb.commands.run("echo on-$(uname -s); echo err >&2")
        assert (r.stdout, r.stderr) == ("on-Linux\n", "err\n")
        cid = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=io.namzu.sandbox={sb.sandbox_id}"], capture_output=True, text=True
        ).stdout.strip()
        used = subprocess.run(["docker", "inspect", "--format", "{{.HostConfig.Runtime}}", cid], capture_output=True, text=True).stdout.strip()
        assert used == runtime, (cid, used)
        with pytest.raises(e2b.CommandExitException) as e:
            sb.commands.run("exit 3")
        assert e.value.exit_code == 3
        sb.files.write("/tmp/x.txt", "docker file")
        assert sb.files.read("/tmp/x.txt") == "docker file"
        h = sb.commands.run("sleep 0.2; echo bg", background=True)
        assert h.wait().stdout == "bg\n"
        sid = sb.sandbox_id
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=io.namzu.sandbox={sid}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
