"""The E2B JavaScript SDK (`e2b` from npm, pinned by clients/e2b-js's lock
file) against `namzu serve`: create, run, files, list, kill."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import ROOT

JS = ROOT / "clients/e2b-js"


def test_the_javascript_sdk(server):
    assert shutil.which("node") and shutil.which("npm"), "Node.js and npm are needed (the test command installs them)"
    if not (JS / "node_modules/e2b").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=JS, check=True, capture_output=True, timeout=300)
    env = dict(os.environ, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=server.keys["alice"])
    r = subprocess.run(["node", "check.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines()[1:] == ["commands ok", "files ok", "killed"], r.stdout
