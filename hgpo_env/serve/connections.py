"""Connections strangers cannot use up: a deadline for each request's headers, caps that close
the oldest incomplete connection rather than refuse a new one.

uvicorn times out a connection only between requests (``--keep-alive``): one that never sends a
complete request, a silent socket or half-sent headers, is held for ever, before any token is
checked. :func:`guarded_protocol` makes uvicorn's HTTP/1.1 protocol (h11) close a connection whose
request headers are not complete within ``deadline_s`` of its opening (or of the data that starts
its next request). Incomplete connections are capped twice, and at either cap the *oldest*
incomplete connection is closed to admit the new one, never the new one refused: a real client
completes its headers in milliseconds, so the one closed is a stranger's, even when strangers
share the token holder's address (a proxy, an ingress, a NAT):

* per address, ``per_address`` connections incomplete for over a second (:func:`stale_after`; a
  trainer's burst of fresh handshakes never counts);
* in all, ``most_pending``, fresh ones included, which the server sets below its limit on open
  files (:func:`pending_cap`), so a burst of silent sockets cannot take the descriptors that
  clients with complete requests (sessions, ``/health``) need.

A connection whose headers are complete (a request or a WebSocket upgrade, where the token is
checked) no longer counts. A WebSocket upgrade with a header line longer than WebSocket servers
read (8 KiB) gets 431 rather than silence.

Incomplete connections are also kept out of uvicorn's own count of connections, which
``--limit-concurrency`` bounds: before, forty silent sockets turned every token holder's request
into 503. A connection counts from its first complete request on (a refused token closes it).

A WebSocket whose client stops reading holds one reply in memory and its socket for ever: the
session's handler waits for the write buffer to drain, and closing the socket waits for it too.
:func:`unread_replies_dropped` makes uvicorn's WebSocket protocol drop (abort) a connection whose
replies have waited unread for ``deadline_s``; its session ends as for a client that left.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import h11
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_UPGRADE_HEADER_LINE = 8190
"""Longest header line the WebSocket handshake reads (the ``websockets`` library's limit)."""


def guarded_protocol(deadline_s: float, per_address: int, most_pending: int) -> type[H11Protocol]:
    """An ``H11Protocol`` class (uvicorn's ``http=``) with these limits; one per server, which
    tracks the incomplete connections of each client address and of all, oldest first."""
    stale_s = stale_after(deadline_s)
    pending: dict[str, dict[H11Protocol, float]] = defaultdict(dict)
    everyone: dict[H11Protocol, float] = {}

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _address = "?"

        @staticmethod
        def pending_count() -> int:
            """Connections whose request is incomplete (not in uvicorn's count)."""
            return len(everyone)

        @staticmethod
        def close_pending() -> None:
            """Close every connection whose request is incomplete (the server is stopping)."""
            for connection in list(everyone):
                connection._expired()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.connections.discard(self)  # counted once a request is complete
            self._address = self.client[0] if self.client else "?"
            self._start_deadline()
            self._make_room()

        def _make_room(self) -> None:
            """At a cap, close the oldest incomplete connection (of this address, or of all)."""
            held = pending.get(self._address, {})
            if self._stale(held) >= per_address:
                next(iter(held))._expired()
            if len(everyone) > most_pending:
                next(iter(everyone))._expired()

        def _stale(self, held: dict[H11Protocol, float]) -> int:
            """Connections in ``held`` older than ``stale_s``, counted up to the cap: they are kept
            in the order they started, so the count stops at the first fresh one."""
            now, stale = self.loop.time(), 0
            for began in held.values():
                if now - began <= stale_s or stale >= per_address:
                    break
                stale += 1
            return stale

        def _start_deadline(self) -> None:
            if self._timer is None and not self.transport.is_closing():
                pending[self._address][self] = everyone[self] = self.loop.time()
                self._timer = self.loop.call_later(deadline_s, self._expired)

        def _headers_done(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            everyone.pop(self, None)
            held = pending.get(self._address)
            if held is not None:
                held.pop(self, None)
                if not held:
                    del pending[self._address]

        def _expired(self) -> None:
            self._headers_done()
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.cycle is None or self.cycle.response_complete:  # the start of a next request
                self._start_deadline()
            counted = self in self.connections
            self.connections.add(self)  # as uvicorn counts it when a request completes in this data
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._headers_done()  # h11 parsed the headers: the app (and its token check) has it
            elif not counted and self._timer is not None:
                self.connections.discard(self)  # still incomplete

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._headers_done()
            if any(len(name) + len(value) + 2 > MAX_UPGRADE_HEADER_LINE for name, value in self.headers):
                self._send_status(431, b"a header line is longer than 8190 bytes")
                return
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            super().connection_lost(exc)

        def _send_status(self, status: int, message: bytes) -> None:
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
            events = (
                h11.Response(status_code=status, headers=headers),
                h11.Data(data=message),
                h11.EndOfMessage(),
            )
            for event in events:
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return GuardedH11Protocol


def pending_cap(open_files: int | None) -> int:
    """How many connections may be incomplete at once: half the process's limit on open files,
    the other half left to connections with a complete request, the env's files and the server's
    own (unbounded where the platform has no such limit)."""
    return max(8, open_files // 2) if open_files else 2**31


def raise_open_files_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit (every connection is a
    file; many systems start processes at 1,024) and return the limit now; None where the
    platform has none (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):  # some systems cap it lower than the hard limit says
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def stale_after(deadline_s: float) -> float:
    """How long a connection may be incomplete before it counts against its address's cap."""
    return min(1.0, deadline_s / 2)


def unread_replies_dropped(deadline_s: float) -> type[WebSocketsSansIOProtocol]:
    """A WebSocket protocol class (uvicorn's ``ws=``) that aborts a connection whose write buffer
    stays over its high-water mark (the client reads none of its replies) for ``deadline_s``.

    A client that sends one message and reads its answer never fills the buffer; one that sends
    without reading fills it within a few replies, and then holds at most the buffer."""

    class UnreadRepliesDropped(WebSocketsSansIOProtocol):
        _stalled: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stalled is None:
                self._stalled = self.loop.call_later(deadline_s, self.transport.abort)

        def resume_writing(self) -> None:
            super().resume_writing()
            self._cancel_stall()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_stall()
            super().connection_lost(exc)

        def _cancel_stall(self) -> None:
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None

    return UnreadRepliesDropped


class GoneClientsUnlogged(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" traceback where a session failed only
    because its client is gone: OpenEnv's handler answers a dropped connection (a client that
    never read its replies) with an error it can no longer send, and a session still busy when
    a shutdown's grace runs out is cancelled. Neither is a fault of the server, and a client must
    not be able to fill its log."""

    GONE = (WebSocketDisconnect, WebSocketDisconnected, ClientDisconnected, asyncio.CancelledError)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], self.GONE))
