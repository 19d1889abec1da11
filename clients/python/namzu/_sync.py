"""The blocking client: :class:`Client` and the :class:`Sandbox` it hands out."""

from __future__ import annotations

from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Optional, Sequence, Union

import httpx

from ._model import (
    Command, CommandResult, Event, EventDecoder, Execution, Exit, FileInfo, Network, Sandbox_, command_body,
    create_body, network_body, parse_network, raise_for,
)

CHUNK = 1 << 16


class Client:
    """A connection to ``namzu serve``. ``api_key`` is sent as a bearer
    token; ``timeout`` bounds each non-streaming call (seconds)."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 120.0, **httpx_args: Any):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, **httpx_args)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        r = self._http.request(method, url, **kw)
        raise_for(r.status_code, r.content)
        return r

    def create(
        self, *, tier: Optional[str] = None, image: Optional[str] = None, runtime: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, metadata: Optional[Dict[str, str]] = None,
        timeout_s: Optional[int] = None, network: Optional[Dict[str, Any]] = None,
        resources: Optional[Dict[str, Any]] = None,
    ) -> "Sandbox":
        """A new sandbox; use it as a context manager to destroy it on exit."""
        body = create_body(tier, image, runtime, env, metadata, timeout_s, network, resources)
        return Sandbox(self, Sandbox_.parse(self._call("POST", "/v1/sandboxes", json=body).json()))

    def get(self, sandbox_id: str) -> "Sandbox":
        """An existing sandbox of this key."""
        return Sandbox(self, Sandbox_.parse(self._call("GET", f"/v1/sandboxes/{sandbox_id}").json()))

    def list(self, metadata: Optional[Dict[str, str]] = None, page_size: Optional[int] = None) -> Iterator["Sandbox"]:
        """Every sandbox of this key with these labels, page by page."""
        params: Dict[str, Any] = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        if page_size:
            params["limit"] = page_size
        while True:
            page = self._call("GET", "/v1/sandboxes", params=params).json()
            for s in page["sandboxes"]:
                yield Sandbox(self, Sandbox_.parse(s))
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]


class Sandbox:
    """One sandbox. ``with client.create() as sb:`` destroys it at the end."""

    def __init__(self, client: Client, info: Sandbox_):
        self._c = client
        self.info = info
        self.id = info.id
        self._p = f"/v1/sandboxes/{info.id}"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def destroy(self) -> None:
        self._c._call("DELETE", self._p)

    def refresh(self) -> Sandbox_:
        self.info = Sandbox_.parse(self._c._call("GET", self._p).json())
        return self.info

    def set_timeout(self, timeout_s: int) -> Sandbox_:
        """Destroyed ``timeout_s`` seconds from now unless extended again."""
        self.info = Sandbox_.parse(self._c._call("POST", f"{self._p}/timeout", json={"timeout_s": timeout_s}).json())
        return self.info

    # ---- commands

    def run(self, cmd: Command, **kw: Any) -> CommandResult:
        """Runs to the end; a ``str`` is a shell script, a list an argv."""
        return CommandResult.parse(self._c._call("POST", f"{self._p}/commands/run", json=command_body(cmd, **kw)).json())

    def stream(self, cmd: Command, **kw: Any) -> "CommandStream":
        """Runs and yields :class:`Output` chunks, then one :class:`Exit`.
        If the stream breaks, :class:`StreamBroken` says where to resume
        with :meth:`attach`."""
        req = self._c._http.build_request("POST", f"{self._p}/commands", json=command_body(cmd, **kw), timeout=None)
        return CommandStream(self._c, req)

    def spawn(self, cmd: Command, *, execution_id: Optional[str] = None, **kw: Any) -> str:
        """Starts a detached command and returns its execution id."""
        body = command_body(cmd, execution_id=execution_id, detached=True, **kw)
        return self._c._call("POST", f"{self._p}/commands", json=body).json()["execution_id"]

    def attach(self, execution_id: str, offset: int = 0, follow: bool = True) -> "CommandStream":
        """An execution's output from ``offset`` (the ``next_offset`` of the
        last event received)."""
        params = {"offset": offset, "follow": str(follow).lower()}
        req = self._c._http.build_request("GET", f"{self._p}/commands/{execution_id}/events", params=params, timeout=None)
        return CommandStream(self._c, req)

    def cancel(self, execution_id: str) -> str:
        return self._c._call("POST", f"{self._p}/commands/{execution_id}/cancel").json()["outcome"]

    def commands(self) -> List[Execution]:
        return [Execution.parse(e) for e in self._c._call("GET", f"{self._p}/commands").json()]

    # ---- files

    def read(self, path: str, offset: int = 0, length: Optional[int] = None) -> bytes:
        return b"".join(self.read_stream(path, offset, length))

    def read_stream(self, path: str, offset: int = 0, length: Optional[int] = None) -> Iterator[bytes]:
        headers = {}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            headers["Range"] = f"bytes={offset}-{end}"
        with self._c._http.stream("GET", f"{self._p}/files/content", params={"path": path}, headers=headers, timeout=None) as r:
            if r.status_code >= 400:
                raise_for(r.status_code, r.read())
            yield from r.iter_bytes(CHUNK)

    def write(self, path: str, data: Union[bytes, str, BinaryIO, Iterable[bytes]], *, mode: Optional[int] = None, create_parents: bool = False) -> int:
        """Replaces the file atomically; ``data`` may be bytes, a file
        object or an iterable of chunks (streamed, never held whole)."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        if create_parents:
            params["create_parents"] = "true"
        if isinstance(data, str):
            data = data.encode()
        if hasattr(data, "read"):
            f = data
            data = iter(lambda: f.read(CHUNK), b"")  # type: ignore[union-attr]
        return self._c._call("PUT", f"{self._p}/files/content", params=params, content=data, timeout=None).json()["bytes"]

    def list_dir(self, path: str) -> List[FileInfo]:
        return [FileInfo.parse(f) for f in self._c._call("GET", f"{self._p}/files/list", params={"path": path}).json()]

    def walk(self, path: str, max_depth: Optional[int] = None, max_entries: Optional[int] = None, include_hidden: bool = False) -> List[FileInfo]:
        params: Dict[str, Any] = {"path": path, "include_hidden": str(include_hidden).lower()}
        if max_depth is not None:
            params["max_depth"] = max_depth
        if max_entries is not None:
            params["max_entries"] = max_entries
        return [FileInfo.parse(f) for f in self._c._call("GET", f"{self._p}/files/walk", params=params).json()]

    def stat(self, path: str) -> FileInfo:
        return FileInfo.parse(self._c._call("GET", f"{self._p}/files/stat", params={"path": path}).json())

    def mkdir(self, path: str, parents: bool = False) -> None:
        self._c._call("POST", f"{self._p}/files/mkdir", json={"path": path, "parents": parents})

    def remove(self, path: str, recursive: bool = False) -> None:
        self._c._call("DELETE", f"{self._p}/files", params={"path": path, "recursive": str(recursive).lower()})

    def rename(self, src: str, dst: str) -> None:
        self._c._call("POST", f"{self._p}/files/rename", json={"from": src, "to": dst})

    # ---- network and lifecycle

    def network(self) -> Network:
        return parse_network(self._c._call("GET", f"{self._p}/network").json())

    def set_network(self, mode: str, allow: Optional[Sequence[Union[str, Dict[str, Any]]]] = None, except_cidrs: Optional[Sequence[str]] = None) -> Network:
        return parse_network(self._c._call("PUT", f"{self._p}/network", json=network_body(mode, allow, except_cidrs)).json())

    def quiesce(self, grace_ms: int = 2000) -> Dict[str, Any]:
        return self._c._call("POST", f"{self._p}/quiesce", json={"grace_ms": grace_ms}).json()

    def flush(self, timeout_ms: int = 30000) -> int:
        return self._c._call("POST", f"{self._p}/flush", json={"timeout_ms": timeout_ms}).json()["took_ms"]


class CommandStream:
    """Iterates a command's events; ``execution_id`` and ``next_offset``
    are known as it goes. Closing it (or leaving a ``with``) stops
    watching; the command goes on."""

    def __init__(self, client: Client, req: httpx.Request):
        self._c = client
        self._req = req
        self._resp: Optional[httpx.Response] = None
        self._dec = EventDecoder()

    @property
    def execution_id(self) -> str:
        return self._dec.execution_id

    @property
    def next_offset(self) -> int:
        return self._dec.next_offset

    def __enter__(self) -> "CommandStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._resp is not None:
            self._resp.close()

    def __iter__(self) -> Iterator[Event]:
        self._resp = self._c._http.send(self._req, stream=True)
        try:
            if self._resp.status_code >= 400:
                raise_for(self._resp.status_code, self._resp.read())
            try:
                for line in self._resp.iter_lines():
                    ev = self._dec.line(line)
                    if ev is not None:
                        yield ev
            except httpx.TransportError:
                pass
            self._dec.end()
        finally:
            self._resp.close()

    def collect(self) -> CommandResult:
        """Reads to the end and gathers the output."""
        out, err = bytearray(), bytearray()
        last = None
        for ev in self:
            if isinstance(ev, Exit):
                last = ev
            elif ev.stream == "stdout":
                out += ev.data
            else:
                err += ev.data
        if last is None:
            self._dec.end()
        assert last is not None
        return CommandResult(self.execution_id, last.status, bytes(out), bytes(err), False, False, last.duration_ms)
