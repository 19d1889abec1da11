"""Fixtures: a live ``namzu serve`` on the local tier (the real binary, real
sandboxes), with two API keys, and helpers to start more servers with other
limits or kill and restart one."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]


def namzu_bin() -> str:
    env = os.environ.get("NAMZU_BIN")
    if env:
        return env
    for p in (ROOT / "target/x86_64-unknown-linux-gnu/debug/namzu", ROOT / "target/debug/namzu"):
        if p.exists():
            return str(p)
    raise RuntimeError("no namzu binary: build it (cargo build --workspace --bins) or set NAMZU_BIN")


@dataclass
class Server:
    """One ``namzu serve`` process."""

    state_dir: Path
    keys: Dict[str, str]
    args: List[str] = field(default_factory=list)
    listen: str = "127.0.0.1:0"
    proc: Optional[subprocess.Popen] = None
    url: str = ""
    log: Optional[Path] = None

    def start(self) -> "Server":
        keyfile = self.state_dir / "keys"
        keyfile.write_text("".join(f"{n} sha256:{hashlib.sha256(k.encode()).hexdigest()}\n" for n, k in self.keys.items()))
        self.log = self.state_dir / f"serve-{time.time_ns()}.log"
        cmd = [namzu_bin(), "serve", "--listen", self.listen, "--tiers", "local,host", "--api-keys", str(keyfile), *self.args]
        env = dict(os.environ, NAMZU_STATE_DIR=str(self.state_dir / "state"), NAMZU_LOG="info")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.log, "w"), env=env, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.wait(5)
            raise RuntimeError(f"namzu serve did not start: {line!r} {self.log.read_text()}")
        self.url = line.split("listening on ")[1].strip()
        # The next start reuses the port, as a restarted service would.
        self.listen = self.url.split("://")[1]
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def client(self, who: str = "alice", **kw) -> httpx.Client:
        # A TLS server of the tests has a self-signed certificate.
        kw.setdefault("verify", not self.url.startswith("https://"))
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.keys[who]}"}, timeout=60, **kw)


def make_keys() -> Dict[str, str]:
    return {name: "nz_" + secrets.token_hex(32) for name in ("alice", "bob")}


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), make_keys()).start()
    yield s
    try:
        cleanup(s)
    finally:
        s.stop()


def cleanup(s: Server) -> None:
    """Destroys what each key still owns, so no sandbox outlives the run."""
    if s.proc is None or s.proc.poll() is not None:
        return
    for who in s.keys:
        with s.client(who) as c:
            for sb in c.get("/v1/sandboxes").json().get("sandboxes", []):
                c.delete(f"/v1/sandboxes/{sb['id']}")


@pytest.fixture
def fresh_server(tmp_path):
    """A server of the test's own, for limits and restarts; its sandboxes
    are destroyed at the end."""
    made: List[Server] = []

    def start(*args: str) -> Server:
        s = Server(tmp_path, make_keys(), list(args)).start()
        made.append(s)
        return s

    yield start
    for s in made:
        try:
            cleanup(s)
        finally:
            s.stop(signal.SIGKILL)


@pytest.fixture
def alice(server):
    with server.client("alice") as c:
        yield c


@pytest.fixture
def bob(server):
    with server.client("bob") as c:
        yield c


@pytest.fixture
def sandbox(alice):
    r = alice.post("/v1/sandboxes", json={"metadata": {"test": "yes"}})
    assert r.status_code == 201, r.text
    sb = r.json()
    yield sb
    alice.delete(f"/v1/sandboxes/{sb['id']}")
