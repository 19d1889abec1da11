"""README's Server section works as written: its curl session and its Python
example, run as they stand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, namzu_bin


def server_section_block(lang: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Server\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{lang}\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"one {lang} block expected in README's Server section"
    return blocks[0]


def test_the_python_example(server):
    env = dict(os.environ, NAMZU_URL=server.url, NAMZU_API_KEY=server.keys["alice"])
    r = subprocess.run([sys.executable, "-c", server_section_block("python")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["b'42\\n'", "stdout b'2\\n'", "exit 3", "3"], r.stdout


def test_the_curl_session(tmp_path: Path):
    env = dict(os.environ, PATH=f"{Path(namzu_bin()).parent}:{os.environ['PATH']}", NAMZU_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run(["bash", "-e", "-c", server_section_block("sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout
    assert '"stdout":"hello from ' in out, out
    assert '"execution_id":"count"' in out and '"type":"exit"' in out, out
    assert out.count('"type":"stdout"') == 3 + 2, "three lines streamed, two re-read from offset 2"
    assert out.rstrip().endswith("draft"), out
