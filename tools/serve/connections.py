"""The appliance's HTTP connections, bounded in time and number (uvicorn's h11 protocol with a
request deadline and an eviction of the idle).

uvicorn times out a connection only *between* requests (`timeout_keep_alive`), and its timer
is cancelled by the first byte a client sends: a client that opens a connection and sends
half a request line, or one header byte now and then, holds it for ever, and with a few
hundred of them no one else is served (`limit_concurrency` counts them too). The token does
not help: it is checked once the headers are complete.

So each connection here has a deadline: from its opening, and again from the end of each
response, the client has `request_timeout` seconds to send a whole request (line, headers
and body); a connection still sending one when it passes is closed. And when more than
`max_connections` are open, the oldest one still sending its request (or idle between two)
is closed for the newcomer: a flood of half-open connections ages out its own members
first, while a request that was complete is answered. Past that, uvicorn's
`limit_concurrency` answers 503.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tools.serve.guard import HttpLimits

log = logging.getLogger(__name__)

#: the largest request line plus headers, in bytes (h11 answers 400 past it)
MAX_HEADER_BYTES = 16 * 1024
#: seconds an idle connection is kept between two requests
KEEP_ALIVE = 5


class DeadlineH11Protocol(H11Protocol):
    """One connection (module docstring); `limits` is set by `protocol_for`."""

    limits = HttpLimits()
    _deadline: asyncio.TimerHandle | None = None
    _since = 0.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.limits.max_connections:
            waiting = [c for c in self.connections
                       if c is not self and isinstance(c, DeadlineH11Protocol) and c._waiting()]
            if waiting:
                oldest = min(waiting, key=lambda c: c._since)
                oldest._close("more connections than serve --max-connections")
                # not counted from now on (its connection_lost comes on a later turn of
                # the loop), lest a request that arrives meanwhile be refused
                self.connections.discard(oldest)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()           # the next request on this connection has its own deadline

    def _arm(self) -> None:
        self._disarm()
        self._since = self.loop.time()
        self._deadline = self.loop.call_later(self.limits.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _waiting(self) -> bool:
        """Is the client still to send (the rest of) a request?"""
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and \
            not self.transport.is_closing()

    def _expired(self) -> None:
        self._deadline = None
        if self._waiting():
            self._close(f"no whole request within {self.limits.request_timeout:g} s")

    def _close(self, why: str) -> None:
        log.debug("closing an HTTP connection from %s: %s", self.client, why)
        self._disarm()
        self.transport.close()


def protocol_for(limits: HttpLimits) -> type[DeadlineH11Protocol]:
    """The protocol class uvicorn makes each connection with, bound to `limits`."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"limits": limits})


def uvicorn_options(limits: HttpLimits) -> dict:
    """uvicorn.Config's keywords for these limits."""
    return {"http": protocol_for(limits), "timeout_keep_alive": KEEP_ALIVE,
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
            # with the eviction above, connections stay at the cap unless every one is
            # busy with a request; past it (or past as many tasks), uvicorn answers 503
            "limit_concurrency": limits.max_connections + 1}
