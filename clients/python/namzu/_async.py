"""The asyncio client: :class:`AsyncClient` and :class:`AsyncSandbox`,
the same operations as the blocking ones, awaited."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Union

import httpx

from ._model import (
    Command, CommandResult, Event, EventDecoder, Execution, FileInfo, Network, Sandbox_, command_body,
    create_body, network_body, parse_network, raise_for,
)

CHUNK = 1 << 16


class AsyncClient:
    """An asyncio connection to ``namzu serve``."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 120.0, **httpx_args: Any):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, **httpx_args)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        r = await self._http.request(method, url, **kw)
        raise_for(r.status_code, r.content)
        return r

    async def create(
        self, *, tier: Optional[str] = None, image: Optional[str] = None, runtime: Optional[str] = None,
        env: Optional[Dict[str, str]] = None, metadata: Optional[Dict[str, str]] = None,
        timeout_s: Optional[int] = None, network: Optional[Dict[str, Any]] = None,
        resources: Optional[Dict[str, Any]] = None,
    ) -> "AsyncSandbox":
        body = create_body(tier, image, runtime, env, metadata, timeout_s, network, resources)
        return AsyncSandbox(self, Sandbox_.parse((await self._call("POST", "/v1/sandboxes", json=body)).json()))

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, Sandbox_.parse((await self._call("GET", f"/v1/sandboxes/{sandbox_id}")).json()))

    async def list(self, metadata: Optional[Dict[str, str]] = None, page_size: Optional[int] = None) -> AsyncIterator["AsyncSandbox"]:
        params: Dict[str, Any] = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        if page_size:
            params["limit"] = page_size
        while True:
            page = (await self._call("GET", "/v1/sandboxes", params=params)).json()
            for s in page["sandboxes"]:
                yield AsyncSandbox(self, Sandbox_.parse(s))
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]


class AsyncSandbox:
    """One sandbox; ``async with`` destroys it at the end."""

    def __init__(self, client: AsyncClient, info: Sandbox_):
        self._c = client
        self.info = info
        self.id = info.id
        self._p = f"/v1/sandboxes/{info.id}"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.destroy()

    async def destroy(self) -> None:
        await self._c._call("DELETE", self._p)

    async def set_timeout(self, timeout_s: int) -> Sandbox_:
        self.info = Sandbox_.parse((await self._c._call("POST", f"{self._p}/timeout", json={"timeout_s": timeout_s})).json())
        return self.info

    async def run(self, cmd: Command, **kw: Any) -> CommandResult:
        r = await self._c._call("POST", f"{self._p}/commands/run", json=command_body(cmd, **kw))
        return CommandResult.parse(r.json())

    def stream(self, cmd: Command, **kw: Any) -> "AsyncCommandStream":
        req = self._c._http.build_request("POST", f"{self._p}/commands", json=command_body(cmd, **kw), timeout=None)
        return AsyncCommandStream(self._c, req)

    async def spawn(self, cmd: Command, *, execution_id: Optional[str] = None, **kw: Any) -> str:
        body = command_body(cmd, execution_id=execution_id, detached=True, **kw)
        return (await self._c._call("POST", f"{self._p}/commands", json=body)).json()["execution_id"]

    def attach(self, execution_id: str, offset: int = 0, follow: bool = True) -> "AsyncCommandStream":
        params = {"offset": offset, "follow": str(follow).lower()}
        req = self._c._http.build_request("GET", f"{self._p}/commands/{execution_id}/events", params=params, timeout=None)
        return AsyncCommandStream(self._c, req)

    async def cancel(self, execution_id: str) -> str:
        return (await self._c._call("POST", f"{self._p}/commands/{execution_id}/cancel")).json()["outcome"]

    async def commands(self) -> List[Execution]:
        return [Execution.parse(e) for e in (await self._c._call("GET", f"{self._p}/commands")).json()]

    async def read(self, path: str) -> bytes:
        return b"".join([c async for c in self.read_stream(path)])

    async def read_stream(self, path: str, offset: int = 0, length: Optional[int] = None) -> AsyncIterator[bytes]:
        headers = {}
        if offset or length is not None:
            end = "" if length is None else str(offset + length - 1)
            headers["Range"] = f"bytes={offset}-{end}"
        async with self._c._http.stream("GET", f"{self._p}/files/content", params={"path": path}, headers=headers, timeout=None) as r:
            if r.status_code >= 400:
                raise_for(r.status_code, await r.aread())
            async for chunk in r.aiter_bytes(CHUNK):
                yield chunk

    async def write(self, path: str, data: Union[bytes, str, Any], *, mode: Optional[int] = None, create_parents: bool = False) -> int:
        """``data``: bytes, or an async iterable of chunks (streamed)."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        if create_parents:
            params["create_parents"] = "true"
        if isinstance(data, str):
            data = data.encode()
        r = await self._c._call("PUT", f"{self._p}/files/content", params=params, content=data, timeout=None)
        return r.json()["bytes"]

    async def list_dir(self, path: str) -> List[FileInfo]:
        return [FileInfo.parse(f) for f in (await self._c._call("GET", f"{self._p}/files/list", params={"path": path})).json()]

    async def stat(self, path: str) -> FileInfo:
        return FileInfo.parse((await self._c._call("GET", f"{self._p}/files/stat", params={"path": path})).json())

    async def mkdir(self, path: str, parents: bool = False) -> None:
        await self._c._call("POST", f"{self._p}/files/mkdir", json={"path": path, "parents": parents})

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._c._call("DELETE", f"{self._p}/files", params={"path": path, "recursive": str(recursive).lower()})

    async def rename(self, src: str, dst: str) -> None:
        await self._c._call("POST", f"{self._p}/files/rename", json={"from": src, "to": dst})

    async def network(self) -> Network:
        return parse_network((await self._c._call("GET", f"{self._p}/network")).json())

    async def set_network(self, mode: str, allow: Optional[Sequence[Union[str, Dict[str, Any]]]] = None, except_cidrs: Optional[Sequence[str]] = None) -> Network:
        r = await self._c._call("PUT", f"{self._p}/network", json=network_body(mode, allow, except_cidrs))
        return parse_network(r.json())


class AsyncCommandStream:
    """``async for ev in stream``: :class:`Output` chunks, then :class:`Exit`."""

    def __init__(self, client: AsyncClient, req: httpx.Request):
        self._c = client
        self._req = req
        self._dec = EventDecoder()

    @property
    def execution_id(self) -> str:
        return self._dec.execution_id

    @property
    def next_offset(self) -> int:
        return self._dec.next_offset

    async def __aiter__(self) -> AsyncIterator[Event]:
        resp = await self._c._http.send(self._req, stream=True)
        try:
            if resp.status_code >= 400:
                raise_for(resp.status_code, await resp.aread())
            try:
                async for line in resp.aiter_lines():
                    ev = self._dec.line(line)
                    if ev is not None:
                        yield ev
            except httpx.TransportError:
                pass
            self._dec.end()
        finally:
            await resp.aclose()
