"""The py4j connection a streaming query's JVM thread calls Python back on, closed when the
query ends.

pyspark's gateway pins threads (py4j's ClientServer): a JVM thread that calls into Python
(the stream's micro-batch thread calling `foreachBatch`) opens a socket of its own to the
Python callback server, and a Python thread serves it. On the JVM side py4j's `PythonClient`
keeps every such connection in a list between calls and never cleans that list (its
periodic cleaner is disabled in pinned mode); the thread's own reference is only
thread-local. So when a query stops and its thread dies, the connection stays open for the
life of the process: one Python thread (blocked reading the socket), a JVM socket and
their buffers per query ever run. An appliance that runs submissions for months would
grow without bound.

`CallbackConnection` notes, from inside a micro-batch (on the pinned thread, so the JVM
call runs on the stream's own thread), which JVM connection serves the stream, and closes
it once the query has ended: removed from `PythonClient`'s list and shut down, which ends
the Python thread too (it reads end of file). Other threads' connections are untouched,
and a thread that calls back again after its connection was closed simply opens a new one
(py4j reconnects a thread whose socket is gone).
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class CallbackConnection:
    """The JVM-side connection one stage's streaming query calls Python back on (module
    docstring). `note` in each micro-batch, `close` after the query ended."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._client = None          # py4j's PythonClient (JVM), where the connection is listed
        self._connection = None      # the JVM ClientServerConnection of the stream's thread

    def note(self, spark) -> None:
        """Called on the thread serving a micro-batch's callback: remember its connection.
        The JVM is asked only when the serving Python thread changed (each connection has a
        Python thread of its own), so a running query pays two calls, at its first batch."""
        thread = threading.current_thread()
        if thread is self._thread:
            return
        from py4j.clientserver import ClientServer

        gateway = spark.sparkContext._gateway  # noqa: SLF001 - pyspark's py4j gateway
        if not isinstance(gateway, ClientServer):
            return                   # not pinned: py4j's callback client cleans up itself
        try:
            client = gateway.java_gateway_server.getCallbackClient()
            connection = client.getPerThreadConnection()
            # only a connection the JVM opened to call Python back: a batch driven from a
            # Python thread (tests, `highlevel.testing`) runs on that thread's own connection,
            # which must stay open
            if connection is None or not connection.isInitiatedFromClient():
                return
        except Exception as exc:  # noqa: BLE001 - an unexpected py4j: nothing is closed later
            log.debug("stream callback connection not found: %s", exc)
            return
        self.close()                 # the thread's earlier one (its socket broke mid-query)
        self._client, self._connection, self._thread = client, connection, thread

    def close(self) -> None:
        """Close the noted connection (the query has ended, its JVM thread calls no more)."""
        client, connection = self._client, self._connection
        self._client = self._connection = self._thread = None
        if connection is None:
            return
        try:
            client.connectionStopped(connection)     # out of PythonClient's list
            connection.shutdown()                    # its socket; the Python thread ends
        except Exception as exc:  # noqa: BLE001 - a gateway already gone closed it with it
            log.debug("stream callback connection not closed: %s", exc)
