"""namzu: a thin client for ``namzu serve``, the sandbox server.

    import namzu
    with namzu.Client("http://127.0.0.1:8080", api_key=KEY) as c:
        with c.create(metadata={"job": "demo"}) as sb:
            print(sb.run("echo hello").stdout)

The server's OpenAPI document (``GET /v1/openapi.json``) is the contract.
"""

from ._async import AsyncClient, AsyncCommandStream, AsyncSandbox
from ._model import (
    CommandResult, Event, Execution, Exit, ExitStatus, FileInfo, NamzuError, Network, Output, StreamBroken,
)
from ._model import Sandbox_ as SandboxInfo
from ._sync import Client, CommandStream, Sandbox

__all__ = [
    "AsyncClient", "AsyncCommandStream", "AsyncSandbox", "Client", "CommandResult", "CommandStream", "Event",
    "Execution", "Exit", "ExitStatus", "FileInfo", "NamzuError", "Network", "Output", "Sandbox", "SandboxInfo",
    "StreamBroken",
]
