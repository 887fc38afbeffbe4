"""Closing idle sessions' WebSockets with a code and a reason.

OpenEnv's reaper reclaims a session idle past ``--session-timeout`` (its env is closed, its slot
freed), but leaves the socket open: the client learns of it only from an error on its next
message. This ASGI middleware watches each ``/ws`` connection for client messages and, once none
came for the timeout, closes the socket with :data:`IDLE_CLOSE_CODE` and a reason, so a client
knows at once why and that it must reconnect; OpenEnv then ends the session as for any client
that leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

IDLE_CLOSE_CODE = 4408
"""WebSocket close code of a session closed for idling (4000-4999: the application's own)."""


class IdleClose:
    """ASGI middleware: close a WebSocket that sent nothing for ``timeout`` seconds."""

    def __init__(self, app: Any, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError(f"the idle timeout must be positive, got {timeout!r}")
        self.app = app
        self.timeout = float(timeout)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        last = loop.time()

        async def tracked_receive() -> dict[str, Any]:
            nonlocal last
            message = await receive()
            last = loop.time()
            return message

        async def watch() -> None:
            while (idle := loop.time() - last) < self.timeout:
                await asyncio.sleep(self.timeout - idle + 0.05)
            reason = f"session idle for more than {self.timeout:g} s: open a new connection"
            with contextlib.suppress(Exception):  # the client may be gone already
                await send({"type": "websocket.close", "code": IDLE_CLOSE_CODE, "reason": reason})

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, tracked_receive, send)
        finally:
            watcher.cancel()
