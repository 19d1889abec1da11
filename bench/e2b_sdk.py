"""E2B SDK flow through `namzu serve` (bench/e2b.sh): Sandbox.create() +
commands.run("true") + kill(), 20 times on the local tier, with the
unmodified SDK. Prints the client's medians per step and the server's own
time for the same requests (from its /metrics histograms), so the share
spent outside the server (SDK, HTTP, Python) is visible. Not a test."""

import hashlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
namzu = sys.argv[2] if len(sys.argv) > 2 else "target/x86_64-unknown-linux-gnu/release/namzu"
state = tempfile.mkdtemp()
key = "nz_" + secrets.token_hex(32)
with open(f"{state}/keys", "w") as f:
    f.write(f"bench sha256:{hashlib.sha256(key.encode()).hexdigest()}\n")
srv = subprocess.Popen(
    [namzu, "serve", "--listen", "127.0.0.1:0", "--api-keys", f"{state}/keys"],
    stdout=subprocess.PIPE, text=True, env=dict(os.environ, NAMZU_STATE_DIR=f"{state}/s"),
)
url = srv.stdout.readline().split("listening on ")[1].strip()
os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
from e2b import Sandbox  # noqa: E402


def server_seconds():
    """Sum of the server's time to response head, by route."""
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("namzu_http_request_seconds_sum{"):
            route = line.split('route="')[1].split('"')[0]
            out[route] = float(line.split()[-1])
    return out


try:
    Sandbox.create().kill()  # warm: the SDK's imports and connection pools
    before = server_seconds()
    steps = {"create": [], "run": [], "kill": [], "total": []}
    for _ in range(N):
        t0 = time.perf_counter()
        sb = Sandbox.create()
        t1 = time.perf_counter()
        sb.commands.run("true")
        t2 = time.perf_counter()
        sb.kill()
        t3 = time.perf_counter()
        for k, v in (("create", t1 - t0), ("run", t2 - t1), ("kill", t3 - t2), ("total", t3 - t0)):
            steps[k].append(v)
    after = server_seconds()
    server = {k: (after.get(k, 0) - before.get(k, 0)) / N for k in after}
    created = server.get("/v2/sandboxes", 0)
    killed = server.get("/sandboxes/{id}", 0)
    started = server.get("e2b-envd /process.Process/Start", 0)
    print(f"## E2B SDK (e2b 2.63.0) through namzu serve, local tier, {N} rounds, medians")
    print()
    print("| step | client (SDK) | server, to response head (mean) |")
    print("|---|---|---|")
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    print(f"| Sandbox.create() | {ms(statistics.median(steps['create']))} | {ms(created)} |")
    print(f"| commands.run('true') | {ms(statistics.median(steps['run']))} | {ms(started)} (the stream's head; the run follows) |")
    print(f"| kill() | {ms(statistics.median(steps['kill']))} | {ms(killed)} |")
    total = statistics.median(steps["total"])
    inside = created + started + killed
    print(f"| create + run + kill | {ms(total)} | {ms(inside)} ({100 * inside / total:.0f}% of the client's time) |")
finally:
    srv.terminate()
    srv.wait(10)
