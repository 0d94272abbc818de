"""The serving engine: one worker thread owns the model and the batched decoders and loops their steps.

Requests reach it through :meth:`ServeEngine.submit` (a bounded count of outstanding requests: beyond it,
:class:`QueueFull`); each carries a ``sink`` that the worker calls with every :class:`JobUpdate` (newly committed
token ids; once, the final result or an error). The HTTP layer turns a sink call into an event on the request's
asyncio queue. :meth:`ServeEngine.cancel` frees a request's slot (a disconnected client, a stop string).

One :class:`~specfold.decoding.core.Decoder` per :class:`~specfold.config.MethodConfig` (a method and, for
specfold, its δ): the server's default one lives as long as the server; one for another method or δ is built when a
request asks for it and dropped once it has no requests.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

from specfold.api import prepare_method
from specfold.config import DecodeConfig, MethodConfig, MethodName
from specfold.decoding.core import BatchEvent, BatchRequest, Decoder, GenerationResult, NonFiniteLogits
from specfold.model.loading import LoadedModel

log = logging.getLogger("specfold.serve")


class QueueFull(RuntimeError):
    """Too many outstanding requests; ``retry_after``: the seconds after which a retry is likely to get a slot."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(RuntimeError):
    """The server is draining or stopped: it takes no new request."""


SHUTDOWN = "the server is shutting down"


@dataclass
class JobUpdate:
    committed: list[int]  # newly committed token ids (the contiguous unmasked prefix)
    result: GenerationResult | None = None  # set once, in the last update
    error: str | None = None  # set once instead of a result when decoding failed
    status: int = 500  # the HTTP status of that error (503: the server shut down before the request finished)


@dataclass
class Job:
    prompt_ids: list[int]
    max_new_tokens: int
    method: MethodConfig  # from ServeEngine.method_for
    sink: Callable[[JobUpdate], None]  # called from the worker thread
    job_id: int = -1  # set by submit
    submitted_at: float = 0.0  # time.monotonic() at submit


@dataclass
class EngineStats:
    submitted: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0


@dataclass
class _Live:
    job: Job
    decoder_key: MethodConfig


@dataclass
class EngineSettings:
    cfg: DecodeConfig  # max_new_tokens is overridden per request
    # The options every method takes those of that apply to it: a resolved graph (a DraftGraph; None: the model has
    # none, so spiffy and specfold are unavailable) and the fold settings, δ being that of a request giving none.
    options: MethodConfig = field(default_factory=lambda: MethodConfig(MethodName.SPECFOLD))
    default_method: MethodName = MethodName.VANILLA  # the method of a request that names none
    max_batch: int = 8
    max_queue: int = 64  # requests waiting beyond the max_batch decoding ones


class ServeEngine:
    def __init__(self, model: LoadedModel, settings: EngineSettings) -> None:
        if settings.max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {settings.max_batch}")
        if settings.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {settings.max_queue}")
        self.model, self.settings = model, settings
        self.default = self.method_for(settings.default_method)
        self.check_method(self.default)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._cancel_requested: set[int] = set()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._decoders: dict[MethodConfig, Any] = {}
        self._live: dict[int, _Live] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._draining = False
        self._request_seconds = 0.0  # a running mean of finished requests' seconds from submit to end
        self._promised: list[float] = []  # when the clients told to retry (429) will be back
        self._decoders[self.default] = self._new_decoder(self.default)  # fail at start-up, not per request

    @property
    def capacity(self) -> int:
        return self.settings.max_batch + self.settings.max_queue

    # -- called from any thread ----------------------------------------------------------------------------------

    def method_for(self, name: str | None = None, delta: float | None = None) -> MethodConfig:
        """The method of a request naming ``name`` (None: the server's default) and ``delta`` (None: the server's),
        with the server's options that apply to it; ValueError naming what is wrong (an unknown method, δ out of
        range, δ for a method other than specfold)."""
        method = self.settings.options.for_method(self.settings.default_method if name is None else name)
        return method if delta is None else replace(method, delta=delta)

    def check_method(self, method: MethodConfig) -> None:
        """ValueError when this server cannot decode ``method`` (a drafting method without a draft graph)."""
        if method.drafts and method.graph is None:
            raise ValueError(f"method {method.method} needs a draft graph and this model has none (pass --graph)")

    def submit(self, job: Job) -> int:
        """Queue a request; its id. QueueFull when ``max_batch + max_queue`` requests are outstanding."""
        self.check_method(job.method)
        with self._lock:
            if self._stopping.is_set() or self._draining:
                raise ShuttingDown(SHUTDOWN)
            if self._outstanding >= self.capacity:
                self.stats.rejected += 1
                wait = self._retry_after()
                raise QueueFull(
                    f"too many concurrent requests (at most {self.capacity}); retry after {wait} s", wait
                )
            self._outstanding += 1
            self.stats.submitted += 1
            job.job_id = next(self._ids)
            job.submitted_at = time.monotonic()
        self._commands.put(("submit", job))
        return job.job_id

    def _retry_after(self) -> int:
        """Whole seconds until a slot is likely free for this client (under the lock): the requests ahead of it —
        those queued and those already told to come back before it — go through the batch ``max_batch`` at a
        time, each taking about the mean request time so far (1 s before any). Counting the clients already told
        spreads the retries out instead of sending them all back at once."""
        now = time.monotonic()
        self._promised = [t for t in self._promised if t > now]
        ahead = max(1, self._outstanding - self.settings.max_batch + 1) + len(self._promised)
        wait = max(1, min(60, math.ceil(ahead / self.settings.max_batch * (self._request_seconds or 1.0))))
        self._promised.append(now + wait)
        return wait

    def cancel(self, job_id: int, outcome: str = "cancelled") -> None:
        """End a request early: ``cancelled`` (its client left) or ``finished`` (a stop string ended its text)."""
        if outcome not in ("cancelled", "finished"):
            raise ValueError(f"outcome must be 'cancelled' or 'finished', got {outcome!r}")
        with self._lock:
            self._cancel_requested.add(job_id)
        self._commands.put(("cancel", (job_id, outcome)))

    def drain(self) -> None:
        """Take no new request (:class:`ShuttingDown`); those outstanding go on until :meth:`stop`."""
        with self._lock:
            self._draining = True

    def snapshot(self) -> dict[str, int | bool]:
        with self._lock:
            return {"outstanding": self._outstanding, "capacity": self.capacity, "draining": self._draining,
                    **vars(self.stats)}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specfold-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0, reason: str = SHUTDOWN) -> None:
        """Stop the worker; requests still outstanding get an error update (``reason``, status 503). Idempotent."""
        self._stopping.set()
        self._commands.put(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout)
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self._end(payload.job_id, JobUpdate([], error=reason, status=503), "failed", payload)
        for live in list(self._live.values()):
            self._end(live.job.job_id, JobUpdate([], error=reason, status=503), "failed")

    # -- the worker thread ---------------------------------------------------------------------------------------

    def _is_cancelled(self, job_id: Hashable) -> bool:
        with self._lock:
            return job_id in self._cancel_requested

    def _new_decoder(self, method: MethodConfig) -> Decoder:
        s = self.settings
        return Decoder(self.model, s.cfg, prepare_method(self.model, method, s.cfg), s.max_batch)

    def _run(self) -> None:
        while not self._stopping.is_set():
            busy = any(not d.idle for d in self._decoders.values())
            try:
                command = self._commands.get(block=not busy, timeout=None if not busy else 0)
            except queue.Empty:
                command = None
            while command is not None:
                if command[0] == "stop":
                    return
                self._apply(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            for key, decoder in list(self._decoders.items()):
                if decoder.idle:
                    continue
                try:
                    events = decoder.step()
                except NonFiniteLogits as exc:  # broken weights or an overflow: one line, not a traceback
                    log.error("decoding stopped (%s): %s", key.label, exc)
                    self._fail_decoder(key, f"decoding failed: {exc}")
                    continue
                except Exception as exc:  # a decoding bug must not take the server down: fail its requests
                    log.exception("decoding step failed (%s)", key.label)
                    self._fail_decoder(key, f"decoding failed: {type(exc).__name__}: {exc}")
                    continue
                for event in events:
                    self._deliver(event)
            for key in [k for k, d in self._decoders.items() if d.idle and k != self.default]:
                del self._decoders[key]

    def _apply(self, command: tuple[str, Any]) -> None:
        kind, payload = command
        if kind == "submit":
            job: Job = payload
            if self._is_cancelled(job.job_id):
                self._end(job.job_id, None, "cancelled", job)
                return
            try:
                decoder = self._decoders.get(job.method) or self._decoders.setdefault(
                    job.method, self._new_decoder(job.method)
                )
                decoder.submit(BatchRequest(job.job_id, list(job.prompt_ids), job.max_new_tokens))
            except Exception as exc:  # bad input the HTTP layer did not catch, or a method that cannot be built
                self._end(job.job_id, JobUpdate([], error=str(exc)), "failed", job)
                return
            self._live[job.job_id] = _Live(job, job.method)
        elif kind == "cancel":
            job_id, outcome = payload
            live = self._live.get(job_id)
            with self._lock:
                self._cancel_requested.discard(job_id)
            if live is not None:
                self._decoders[live.decoder_key].cancel(job_id)
                self._end(job_id, None, outcome)

    def _deliver(self, event: BatchEvent) -> None:
        live = self._live.get(event.request_id)
        if live is None:
            return
        update = JobUpdate(list(event.committed), event.result)
        if event.result is None:
            live.job.sink(update)
        else:
            self._end(event.request_id, update, "finished")

    def _fail_decoder(self, key: MethodConfig, message: str) -> None:
        for job_id in [i for i, live in self._live.items() if live.decoder_key == key]:
            self._end(job_id, JobUpdate([], error=message), "failed")
        del self._decoders[key]
        if key == self.default:
            self._decoders[key] = self._new_decoder(key)

    def _end(self, job_id: int, update: JobUpdate | None, outcome: str, job: Job | None = None) -> None:
        live = self._live.pop(job_id, None)
        job = job or (live.job if live is not None else None)
        with self._lock:
            self._cancel_requested.discard(job_id)
            self._outstanding -= 1
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
            if outcome == "finished" and job is not None:  # a running mean: Retry-After's request time
                took = time.monotonic() - job.submitted_at
                self._request_seconds += (0.2 if self._request_seconds else 1.0) * (took - self._request_seconds)
        if update is not None and job is not None:
            job.sink(update)
