"""Bad WebSocket frames get a short error reply and the session goes on.

OpenEnv's ``/ws`` loop answers a frame that is not JSON with an error, but a frame it cannot
read at all ends the session: a binary frame, JSON that is not an object (an array, ``null``),
JSON nested deeper than Python's parser recurses, a number longer than Python converts. And a
frame it can read may cost every session: pydantic reports each unknown key with its input (a
1.3 MB step with 100k extra keys came back as a 15 MB error and held the event loop). This ASGI
middleware reads every frame before the loop does and answers those itself, in the loop's own
error format (``{"type": "error", "data": {"message", "code"}}``), in a few lines that echo no
input: the message must have the shape of one of the session messages, with a bounded number of
JSON values and bounded nesting. Frames over :data:`OFF_LOOP_BYTES` are checked in a process of
their own: ``json.loads`` holds the GIL, so in a thread a 4 MB frame of two million values still
held every other session 60-90 ms.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import reprlib
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from openenv.core.env_server.types import WSErrorCode, WSErrorResponse

from hgpo_env.textenv.orphans import exit_with_parent

MAX_VALUES = 10_000
"""JSON values (objects, arrays, strings, numbers, ...) one message may hold."""
MAX_DEPTH = 32
"""Nesting depth one message may reach."""
OFF_LOOP_BYTES = 64 * 2**10
"""Frames larger than this are parsed and checked in another process, not on the event loop."""
MESSAGE_KEYS = {
    "reset": frozenset({"seed", "episode_id", "task_id", "split", "index", "env_kwargs", "env_id"}),
    "step": frozenset({"response", "metadata"}),
    "state": frozenset(),
    "close": frozenset(),
}
"""The session messages and the keys of their ``data`` (a reset's, the action's fields)."""


def _budget_problem(value: Any) -> str | None:
    """Too many values or too deep, found without recursion (a deep message must not recurse here)."""
    count, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            return f"more than {MAX_VALUES} JSON values in one message"
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return None


def _shape_problem(message: dict[str, Any]) -> str | None:
    """What makes ``message`` (of a known type) none of the session messages, in words that quote no input."""
    kind = message["type"]
    extra = sorted(set(message) - {"type", "data"})
    if extra:
        return f"unknown message keys {reprlib.repr(extra)}: a message has type and data"
    data = message.get("data", {})
    if not isinstance(data, dict):
        return f"a {kind} message's data is an object"
    unknown = sorted(set(data) - MESSAGE_KEYS[kind])
    if unknown:
        allowed = sorted(MESSAGE_KEYS[kind])
        return f"unknown {kind} data keys {reprlib.repr(unknown)} ({len(unknown)}); {kind} takes {allowed}"
    if kind == "step" and not isinstance(data.get("response"), str):
        return "a step's data.response is the model's response, a string"
    return None


def frame_problem(message: dict[str, Any]) -> tuple[str, str] | None:
    """``(code, message)`` for a ``websocket.receive`` event the session loop should not take."""
    text = message.get("text")
    if text is None:
        return WSErrorCode.INVALID_JSON, "binary frames are not accepted: send JSON text"
    try:
        parsed = json.loads(text)
    except RecursionError:
        return WSErrorCode.INVALID_JSON, "Invalid JSON: nested too deeply"
    except ValueError as error:  # JSONDecodeError, and numbers past Python's digit limit
        return WSErrorCode.INVALID_JSON, f"Invalid JSON: {str(error)[:200]}"
    if not isinstance(parsed, dict):
        return WSErrorCode.VALIDATION_ERROR, f"a message is a JSON object, got {type(parsed).__name__}"
    kind = parsed.get("type")
    if kind == "mcp":  # OpenEnv's MCP messages: its own handler validates them
        return None
    if not isinstance(kind, str) or kind not in MESSAGE_KEYS:
        return WSErrorCode.UNKNOWN_TYPE, f"a message's type is one of {sorted(MESSAGE_KEYS)}"
    problem = _budget_problem(parsed) or _shape_problem(parsed)
    return None if problem is None else (WSErrorCode.VALIDATION_ERROR, problem)


@functools.cache
def _checker() -> ProcessPoolExecutor:
    """The process that checks large frames (one per server, started at the first large frame);
    it ends with the server however the server ends (a SIGKILL runs no shutdown)."""
    return ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=exit_with_parent
    )


def stop_checker() -> None:
    """Stop the frame-check process, if a large frame started one (at the server's shutdown)."""
    if _checker.cache_info().currsize:
        _checker().shutdown(cancel_futures=True)
        _checker.cache_clear()


class FrameGuard:
    """ASGI middleware for the WebSocket routes: answers unreadable frames, passes the rest on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def checked_receive() -> dict[str, Any]:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                size = len(message.get("text") or message.get("bytes") or "")
                if size > OFF_LOOP_BYTES:  # other sessions keep stepping meanwhile
                    loop = asyncio.get_running_loop()
                    problem = await loop.run_in_executor(_checker(), frame_problem, message)
                else:
                    problem = frame_problem(message)
                if problem is None:
                    return message
                code, text = problem
                reply = WSErrorResponse(data={"message": text, "code": code})
                await send({"type": "websocket.send", "text": reply.model_dump_json()})

        await self.app(scope, checked_receive, send)
