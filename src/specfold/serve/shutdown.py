"""Shutting the server down without a silent cut: on the first SIGTERM/SIGINT :class:`DrainingServer` stops
taking connections and requests, lets the open requests finish for up to ``drain_seconds``, ends those still open
with an explicit error (the engine's 503 update: a stream's last ``data:`` is an error object), and only then
lets uvicorn shut down. A second signal cuts the drain short (the same error events).

NOTE: uvicorn's own shutdown ends every open SSE stream at once (sse-starlette watches the server's
``should_exit``), which is the silent cut this avoids: ``should_exit`` is set only after the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

log = logging.getLogger("specfold.serve")

HANDLER_GRACE_S = 2.0  # after ending the open requests: time for their handlers to send the error events


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, drain_seconds: float) -> None:
        super().__init__(config)
        self.engine, self.drain_seconds = engine, drain_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._hurry = asyncio.Event()

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:  # a signal handler, run on the loop's thread between callbacks
        if self._loop is None or self.should_exit:
            self.should_exit = True
            return
        if self._drain_task is None:
            self._loop.call_soon_threadsafe(self._start_drain)
        else:
            self._loop.call_soon_threadsafe(self._hurry.set)  # a second signal: end the drain now

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        self.engine.drain()  # a new request on an open connection: 503
        for server in self.servers:  # no new connections
            server.close()
        log.info("draining: %d open request(s), up to %g s", self.engine.snapshot()["outstanding"],
                 self.drain_seconds)
        deadline = loop.time() + self.drain_seconds
        while self.engine.snapshot()["outstanding"] and loop.time() < deadline and not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), 0.05)
        left = self.engine.snapshot()["outstanding"]
        if left:
            log.warning("drain over: ending %d unfinished request(s) with an error", left)
            reason = (f"the server is shutting down: the request did not finish within the "
                      f"{self.drain_seconds:g} s drain")
            await asyncio.to_thread(self.engine.stop, 10.0, reason)
            until = loop.time() + HANDLER_GRACE_S
            while self.server_state.tasks and loop.time() < until:
                await asyncio.sleep(0.02)
        self.should_exit = True
