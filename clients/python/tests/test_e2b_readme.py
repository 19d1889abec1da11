"""README's "Use the E2B SDK with namzu" example, run as written with its
three variables pointing at a live server."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_the_e2b_example_in_the_readme(server):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Use the E2B SDK with namzu\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    env = dict(os.environ, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=server.keys["alice"])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from namzu\nhi\n", r.stdout
