"""Typed results of the namzu API, and the request shapes shared by the sync
and async clients. The OpenAPI document (``GET /v1/openapi.json``) is the
contract; these types mirror it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

Command = Union[str, Sequence[str]]


class NamzuError(Exception):
    """An error answered by the server: ``status``, a stable ``code`` to
    branch on, a ``message`` for people, and the ``field`` it is about."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class StreamBroken(NamzuError):
    """A command's stream ended without its exit (the server went away or
    shut down). The command goes on: re-attach from ``next_offset``."""

    def __init__(self, code: str, message: str, next_offset: int, execution_id: str):
        super().__init__(0, code, message)
        self.next_offset = next_offset
        self.execution_id = execution_id


@dataclass
class ExitStatus:
    code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    cancelled: bool

    @property
    def success(self) -> bool:
        return self.code == 0

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "ExitStatus":
        return cls(d.get("code"), d.get("signal"), d["timed_out"], d["cancelled"])


@dataclass
class Sandbox_:
    id: str
    tier: str
    metadata: Dict[str, str]
    created_at_ms: int
    expires_at_ms: int
    state: str
    image: Optional[str] = None
    runtime: Optional[str] = None

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "Sandbox_":
        return cls(
            d["id"], d["tier"], d.get("metadata", {}), d["created_at_ms"], d["expires_at_ms"], d["state"],
            d.get("image"), d.get("runtime"),
        )


@dataclass
class CommandResult:
    execution_id: str
    status: ExitStatus
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int

    @property
    def exit_code(self) -> Optional[int]:
        return self.status.code

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "CommandResult":
        if d["encoding"] == "utf8":
            out, err = d["stdout"].encode(), d["stderr"].encode()
        else:
            out, err = base64.b64decode(d["stdout"]), base64.b64decode(d["stderr"])
        return cls(
            d["execution_id"], ExitStatus.parse(d["status"]), out, err,
            d["stdout_truncated"], d["stderr_truncated"], d["duration_ms"],
        )


@dataclass
class Output:
    """A chunk of output: ``stream`` is ``stdout`` or ``stderr``; resume
    after it from ``next_offset``."""

    stream: str
    data: bytes
    offset: int
    next_offset: int


@dataclass
class Exit:
    """The last event of a command."""

    status: ExitStatus
    stdout_bytes: int
    stderr_bytes: int
    duration_ms: int
    next_offset: int


Event = Union[Output, Exit]


@dataclass
class Execution:
    execution_id: str
    state: str
    pid: Optional[int]
    output_bytes: int
    status: Optional[ExitStatus] = None

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "Execution":
        st = d.get("status")
        return cls(d["execution_id"], d["state"], d.get("pid"), d["output_bytes"], ExitStatus.parse(st) if st else None)


@dataclass
class FileInfo:
    path: str
    name: str
    kind: str
    size: int
    mode: int
    mtime_ms: int
    depth: int = 0
    symlink_target: Optional[str] = None

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(d["path"], d["name"], d["kind"], d["size"], d["mode"], d["mtime_ms"], d.get("depth", 0), d.get("symlink_target"))


@dataclass
class Network:
    mode: str
    allow: List[Dict[str, Any]] = field(default_factory=list)
    except_cidrs: List[str] = field(default_factory=list)
    open_connections: int = 0


def command_body(
    cmd: Command,
    *,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    stdin: Optional[bytes] = None,
    timeout: Optional[float] = None,
    execution_id: Optional[str] = None,
    detached: bool = False,
) -> Dict[str, Any]:
    """The JSON body of a command: a ``str`` is a shell script, a sequence
    an argv."""
    body: Dict[str, Any] = {"script": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = env
    if stdin is not None:
        body["stdin_b64"] = base64.b64encode(stdin).decode()
    if timeout is not None:
        body["timeout_ms"] = int(timeout * 1000)
    if execution_id is not None:
        body["execution_id"] = execution_id
    if detached:
        body["detached"] = True
    return body


class EventDecoder:
    """Turns NDJSON lines into events; remembers where to resume."""

    def __init__(self) -> None:
        self.execution_id = ""
        self.next_offset = 0
        self.done = False

    def line(self, raw: str) -> Optional[Event]:
        if not raw.strip():
            return None
        d = json.loads(raw)
        t = d["type"]
        if t == "start":
            self.execution_id = d["execution_id"]
            self.next_offset = d["next_offset"]
            return None
        if t in ("stdout", "stderr"):
            self.next_offset = d["next_offset"]
            return Output(t, base64.b64decode(d["data"]), d["offset"], d["next_offset"])
        if t == "exit":
            self.next_offset = d["next_offset"]
            self.done = True
            return Exit(ExitStatus.parse(d["status"]), d["stdout_bytes"], d["stderr_bytes"], d["duration_ms"], d["next_offset"])
        if t == "error":
            raise StreamBroken(d["code"], d["message"], d["next_offset"], self.execution_id)
        return None

    def end(self) -> None:
        if not self.done:
            raise StreamBroken("stream_ended", "the stream ended before the exit", self.next_offset, self.execution_id)


def raise_for(status: int, body: bytes) -> None:
    if status < 400:
        return
    try:
        d = json.loads(body)
        raise NamzuError(status, d["code"], d["message"], d.get("field"))
    except (ValueError, KeyError):
        raise NamzuError(status, "http_error", body.decode(errors="replace")) from None


def network_body(mode: str, allow: Optional[Sequence[Union[str, Dict[str, Any]]]] = None, except_cidrs: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"mode": mode}
    if allow:
        body["allow"] = [{"host": a} if isinstance(a, str) else dict(a) for a in allow]
    if except_cidrs:
        body["except_cidrs"] = list(except_cidrs)
    return body


def parse_network(d: Dict[str, Any]) -> Network:
    p = d["policy"]
    return Network(p["mode"], p.get("allow", []), p.get("except_cidrs", []), d["open_connections"])


def create_body(
    tier: Optional[str], image: Optional[str], runtime: Optional[str], env: Optional[Dict[str, str]],
    metadata: Optional[Dict[str, str]], timeout_s: Optional[int], network: Optional[Dict[str, Any]],
    resources: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    for k, v in (("tier", tier), ("image", image), ("runtime", runtime), ("env", env), ("metadata", metadata),
                 ("timeout_s", timeout_s), ("network", network), ("resources", resources)):
        if v is not None:
            body[k] = v
    return body
