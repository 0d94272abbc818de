"""The serving engine: one worker thread owns the model and the batched decoders and loops their steps.

Requests reach it through :meth:`ServeEngine.submit` (a bounded count of outstanding requests: beyond it,
:class:`QueueFull`); each carries a ``sink`` that the worker calls with every :class:`JobUpdate` (newly committed
token ids; once, the final result or an error). The HTTP layer turns a sink call into an event on the request's
asyncio queue. :meth:`ServeEngine.cancel` frees a request's slot (a disconnected client, a stop string).

One :class:`~specfold.decoding.batch.BatchDecoder` per (method, δ): the server's default one lives as long as the
server; one for another method or δ is built when a request asks for it and dropped once it has no requests.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from specfold.api import METHODS, prepare_method
from specfold.config import DecodeConfig
from specfold.decoding.batch import BatchDecoder, BatchEvent, BatchRequest
from specfold.decoding.decoder import GenerationResult
from specfold.decoding.draft_graph import DraftGraph
from specfold.model.loading import LoadedModel

log = logging.getLogger("specfold.serve")

MAX_DELTA = 1.0  # δ is a relative-residual tolerance; the paper sweeps 0.01-0.7


class QueueFull(RuntimeError):
    """Too many outstanding requests."""


@dataclass(frozen=True)
class MethodKey:
    """What decodes a request: the method and, for specfold, its δ."""

    name: str
    delta: float | None = None


@dataclass(frozen=True)
class MethodOptions:
    """How the drafting methods are built (shared by every δ)."""

    graph: DraftGraph | None = None  # None: the model has no draft graph, so spiffy/specfold are unavailable
    backend: str = "torch"
    ffn: str = "residual"
    attention: str = "auto"


@dataclass
class JobUpdate:
    committed: list[int]  # newly committed token ids (the contiguous unmasked prefix)
    result: GenerationResult | None = None  # set once, in the last update
    error: str | None = None  # set once instead of a result when decoding failed


@dataclass
class Job:
    prompt_ids: list[int]
    max_new_tokens: int
    key: MethodKey
    sink: Callable[[JobUpdate], None]  # called from the worker thread
    job_id: int = -1  # set by submit


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
    decoder_key: MethodKey


@dataclass
class EngineSettings:
    cfg: DecodeConfig  # max_new_tokens is overridden per request
    default: MethodKey
    options: MethodOptions = field(default_factory=MethodOptions)
    max_batch: int = 8
    max_queue: int = 64  # requests waiting beyond the max_batch decoding ones


class ServeEngine:
    def __init__(self, model: LoadedModel, settings: EngineSettings) -> None:
        if settings.max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {settings.max_batch}")
        if settings.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {settings.max_queue}")
        self.model, self.settings = model, settings
        self.check_method(settings.default)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._cancel_requested: set[int] = set()
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._decoders: dict[MethodKey, Any] = {}
        self._live: dict[int, _Live] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._decoders[settings.default] = self._new_decoder(settings.default)  # fail at start-up, not per request

    @property
    def capacity(self) -> int:
        return self.settings.max_batch + self.settings.max_queue

    # -- called from any thread ----------------------------------------------------------------------------------

    def check_method(self, key: MethodKey) -> None:
        """ValueError naming what is wrong with a (method, δ)."""
        if key.name not in METHODS:
            raise ValueError(f"unknown method {key.name!r}; choose one of {', '.join(METHODS)}")
        if key.name != "specfold" and key.delta is not None:
            raise ValueError(f"delta applies to method specfold, not {key.name}")
        if key.name == "specfold" and (key.delta is None or not 0.0 <= key.delta <= MAX_DELTA):
            raise ValueError(f"delta must be in [0, {MAX_DELTA:g}], got {key.delta}")
        if key.name != "vanilla" and self.settings.options.graph is None:
            raise ValueError(f"method {key.name} needs a draft graph and this model has none (pass --graph)")

    def submit(self, job: Job) -> int:
        """Queue a request; its id. QueueFull when ``max_batch + max_queue`` requests are outstanding."""
        self.check_method(job.key)
        with self._lock:
            if self._stopping.is_set():
                raise QueueFull("the server is shutting down")
            if self._outstanding >= self.capacity:
                self.stats.rejected += 1
                raise QueueFull(f"too many concurrent requests (at most {self.capacity}); retry later")
            self._outstanding += 1
            self.stats.submitted += 1
            job.job_id = next(self._ids)
        self._commands.put(("submit", job))
        return job.job_id

    def cancel(self, job_id: int) -> None:
        with self._lock:
            self._cancel_requested.add(job_id)
        self._commands.put(("cancel", job_id))

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"outstanding": self._outstanding, "capacity": self.capacity, **vars(self.stats)}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specfold-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker; requests still outstanding get an error update."""
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
                self._end(payload.job_id, JobUpdate([], error="the server is shutting down"), "failed", payload)
        for live in list(self._live.values()):
            self._end(live.job.job_id, JobUpdate([], error="the server is shutting down"), "failed")

    # -- the worker thread ---------------------------------------------------------------------------------------

    def _is_cancelled(self, job_id: Hashable) -> bool:
        with self._lock:
            return job_id in self._cancel_requested

    def _new_decoder(self, key: MethodKey):
        s = self.settings
        if key.name == "vanilla":
            method = prepare_method(self.model, "vanilla")
        else:
            o = s.options
            folded = dict(delta=key.delta, backend=o.backend, ffn=o.ffn, attention=o.attention)
            method = prepare_method(
                self.model, key.name, s.cfg.small_block_size, graph=o.graph,
                **(folded if key.name == "specfold" else {}),
            )
        return BatchDecoder(self.model, s.cfg, method, s.max_batch)

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
                except Exception as exc:  # a decoding bug must not take the server down: fail its requests
                    log.exception("decoding step failed (%s)", key)
                    self._fail_decoder(key, f"decoding failed: {type(exc).__name__}: {exc}")
                    continue
                for event in events:
                    self._deliver(event)
            for key in [k for k, d in self._decoders.items() if d.idle and k != self.settings.default]:
                del self._decoders[key]

    def _apply(self, command: tuple[str, Any]) -> None:
        kind, payload = command
        if kind == "submit":
            job: Job = payload
            if self._is_cancelled(job.job_id):
                self._end(job.job_id, None, "cancelled", job)
                return
            try:
                decoder = self._decoders.get(job.key) or self._decoders.setdefault(job.key, self._new_decoder(job.key))
                decoder.submit(BatchRequest(job.job_id, list(job.prompt_ids), job.max_new_tokens))
            except Exception as exc:  # bad input the HTTP layer did not catch, or a method that cannot be built
                self._end(job.job_id, JobUpdate([], error=str(exc)), "failed", job)
                return
            self._live[job.job_id] = _Live(job, job.key)
        elif kind == "cancel":
            live = self._live.get(payload)
            with self._lock:
                self._cancel_requested.discard(payload)
            if live is not None:
                self._decoders[live.decoder_key].cancel(payload)
                self._end(payload, None, "cancelled")

    def _deliver(self, event: BatchEvent) -> None:
        live = self._live.get(event.request_id)
        if live is None:
            return
        update = JobUpdate(list(event.committed), event.result)
        if event.result is None:
            live.job.sink(update)
        else:
            self._end(event.request_id, update, "finished")

    def _fail_decoder(self, key: MethodKey, message: str) -> None:
        for job_id in [i for i, live in self._live.items() if live.decoder_key == key]:
            self._end(job_id, JobUpdate([], error=message), "failed")
        del self._decoders[key]
        if key == self.settings.default:
            self._decoders[key] = self._new_decoder(key)

    def _end(self, job_id: int, update: JobUpdate | None, outcome: str, job: Job | None = None) -> None:
        live = self._live.pop(job_id, None)
        job = job or (live.job if live is not None else None)
        with self._lock:
            self._cancel_requested.discard(job_id)
            self._outstanding -= 1
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        if update is not None and job is not None:
            job.sink(update)
