"""The OpenAI-compatible HTTP layer (FastAPI): ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /health``.

Handlers run on the event loop thread; the CPU-heavy steps of a request (validating and tokenising its text) run
on one tokenizer thread, so that a large request never holds up the others or ``/health``; the model is used only
by the engine's worker thread (:mod:`specfold.serve.engine`). A request body larger than ``max_body_bytes`` is
answered 413 before it is parsed (:class:`BodyLimit`). A request's updates arrive on its own asyncio queue
(``loop.call_soon_threadsafe``). A streamed response sends the committed prefix's text as it grows
(:class:`~specfold.serve.text.TextStream`); a client that disconnects cancels the request in the engine, a stop
string finishes it. Errors are OpenAI-style JSON: ``{"error": {"message", "type", "param", "code"}}``; a 429
carries ``Retry-After``; a stream that cannot finish (the server shutting down) ends with such an error object
as its last ``data:`` event, never silently.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from specfold.api import tokenize
from specfold.config import MethodConfig, MethodName
from specfold.decoding.core import GenerationResult, check_prompt
from specfold.model.loading import LoadedModel
from specfold.serve.engine import Job, JobUpdate, QueueFull, ServeEngine, ShuttingDown
from specfold.serve.schemas import ChatCompletionRequest, CompletionRequest
from specfold.serve.text import TextStream
from specfold.validation import ValidationError, check_text

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # far above any prompt the model's position limit allows


@dataclass(frozen=True)
class AppSettings:
    model_name: str  # the id /v1/models lists and requests name
    default_max_tokens: int = 256
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request body is answered 413 unread


class APIError(Exception):
    def __init__(
        self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
        code: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 before the app sees (or parses) it —
    at once when its ``Content-Length`` says so, else as soon as the bytes received pass the limit."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send, int(length))
            return
        chunks, size = [], 0
        while True:  # read the body here, counting, and hand it on whole
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(scope, receive, send, None)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then only http.disconnect (the handlers watch for it)

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, length: int | None) -> None:
        size = f"{length} bytes" if length is not None else "more than that"
        err = APIError(413, f"the request body is {size}; this server takes at most {self.limit} bytes "
                       "(specfold serve --max-body-bytes)", code="request_too_large", headers={"Connection": "close"})
        await err.response()(scope, receive, send)


def _validation_error(exc: RequestValidationError) -> APIError:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    kind = err.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}")
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param=param)
    if kind == "missing":
        return APIError(400, f"missing required field {param!r}", param=param)
    if param is None:
        return APIError(400, f"the body must be a JSON object: {err.get('msg')}")
    return APIError(400, f"{param}: {err.get('msg')}", param=param)


class _Run:
    """One request in flight: its engine job, its updates and its text."""

    def __init__(self, engine: ServeEngine, job: Job, updates: asyncio.Queue, text: TextStream) -> None:
        self.engine, self.job, self.updates, self.text = engine, job, updates, text
        self.result: GenerationResult | None = None
        self.finish_reason: str | None = None

    async def deltas(self) -> AsyncIterator[str]:
        """Text deltas until the request ends (result, stop string or error); cancels it if left early."""
        try:
            while self.finish_reason is None:
                update: JobUpdate = await self.updates.get()
                if update.error is not None:
                    self.finish_reason = "error"
                    code = "server_shutting_down" if update.status == 503 else None
                    raise APIError(update.status, update.error, type="server_error", code=code)
                delta = self.text.update(update.committed)
                if update.result is not None:
                    self.result = update.result
                if self.text.stopped:
                    self.finish_reason = "stop"
                    if self.result is None:  # the text is complete: the request finished, its slot is freed
                        self.engine.cancel(self.job.job_id, outcome="finished")
                elif self.result is not None:
                    delta += self.text.finish()
                    self.finish_reason = "stop" if self.result.stopped else "length"
                if delta:
                    yield delta
        finally:
            if self.finish_reason is None:
                self.engine.cancel(self.job.job_id)

    def usage(self) -> dict:
        prompt, completion = len(self.job.prompt_ids), len(self.text.ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extension(self) -> dict:
        """specfold's fields: the tokens and what decoding them cost (None where a stop string ended it early)."""
        r, method = self.result, self.job.method
        specfold = method.method is MethodName.SPECFOLD
        return {
            "method": method.method.value,
            "delta": method.delta if specfold else None,
            "token_ids": list(self.text.ids),
            "nfe": r.nfe if r else None,
            "nfe_denoise": r.nfe_denoise if r else None,
            "nfe_cache": r.nfe_cache if r else None,
            "accepted_drafts": r.accepted_drafts if r else None,
            "fold_ratio": r.engine_stats.fold_ratio() if r and specfold else None,
            "decode_seconds": r.seconds if r else None,
        }


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(model: LoadedModel, engine: ServeEngine, settings: AppSettings) -> FastAPI:
    """The app; the engine's worker starts and stops with it."""
    tok = model.tokenizer
    if tok is None:
        raise ValueError(f"{model.path} has no tokenizer; the server needs one")
    created = int(time.time())
    # NOTE: one thread owns the tokenizer's encoding (validating and tokenising a request's text): off the event
    # loop, so a large prompt never stalls /health or the other streams, and one at a time, as the tokenizer wants.
    text_worker = ThreadPoolExecutor(1, thread_name_prefix="specfold-tokenizer")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.stop()
            text_worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="specfold", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(text_worker, fn, *args)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = _validation_error(exc)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
        return JSONResponse(err.body(), status_code=500)

    def request_method(body) -> MethodConfig:
        try:
            method = engine.method_for(body.method, body.delta)
            engine.check_method(method)
        except ValueError as exc:
            raise APIError(400, str(exc), param="delta" if str(exc).startswith("delta") else "method") from None
        return method

    async def start(request: Request, body, prompt_ids: list[int], max_tokens: int | None, chat: bool):
        if body.model is not None and body.model != settings.model_name:
            raise APIError(
                404, f"the model {body.model!r} does not exist; this server serves {settings.model_name!r}",
                param="model", code="model_not_found",
            )
        method = request_method(body)
        cfg = replace(engine.settings.cfg, max_new_tokens=max_tokens or settings.default_max_tokens)
        try:
            await off_loop(check_prompt, model, prompt_ids, cfg)  # a tensor of every id: off the loop too
        except ValueError as exc:
            param = "max_tokens" if "max_new_tokens" in str(exc) else ("messages" if chat else "prompt")
            raise APIError(400, str(exc).replace("max_new_tokens", "max_tokens"), param=param) from None
        updates: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(update: JobUpdate) -> None:  # the worker thread
            try:
                loop.call_soon_threadsafe(updates.put_nowait, update)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        job = Job(list(prompt_ids), cfg.max_new_tokens, method, sink)
        try:
            engine.submit(job)
        except QueueFull as exc:
            raise APIError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(exc.retry_after)}) from None
        except ShuttingDown as exc:
            raise APIError(503, str(exc), type="server_error", code="server_shutting_down",
                           headers={"Connection": "close"}) from None
        run = _Run(engine, job, updates, TextStream(tok, body.stop_strings()))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return EventSourceResponse(_sse(run, chat, include_usage), sep="\n", ping=15)
        consumer = asyncio.ensure_future(_drain(run))
        watcher = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not consumer.done():
                consumer.cancel()  # the client left: its generator's cleanup cancels the job
                with suppress(asyncio.CancelledError):
                    await consumer  # until the cancellation has run (result() of a pending task would raise)
        if consumer.cancelled():
            raise APIError(499, "the client disconnected")
        consumer.result()  # re-raises an engine error
        return JSONResponse(_response(run, chat))

    async def _drain(run: _Run) -> None:
        async for _ in run.deltas():
            pass

    def _response(run: _Run, chat: bool) -> dict:
        choice: dict = {"index": 0, "finish_reason": run.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": run.text.text}
        else:
            choice["text"] = run.text.text
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{run.job.job_id}-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": settings.model_name,
            "choices": [choice],
            "usage": run.usage(),
            "specfold": run.extension(),
        }

    async def _sse(run: _Run, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        head = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{run.job.job_id}-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": settings.model_name,
        }
        extra = {"usage": None} if include_usage else {}

        def chunk(delta: str | None, finish: str | None = None, **more) -> str:
            choice: dict = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["delta"] = {} if delta is None else {"content": delta}
            else:
                choice["text"] = delta or ""
            return json.dumps({**head, "choices": [choice], **extra, **more})

        if chat:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}
            yield json.dumps({**head, "choices": [first], **extra})
        try:
            async for delta in run.deltas():
                yield chunk(delta)
        except APIError as exc:
            yield json.dumps(exc.body())
            return
        yield chunk(None, run.finish_reason, specfold=run.extension())
        if include_usage:
            yield json.dumps({**head, "choices": [], "usage": run.usage()})
        yield "[DONE]"

    def check_stop(body) -> None:
        if any(not s for s in body.stop_strings()):
            raise APIError(400, "stop: a stop string must not be empty", param="stop")

    def encode_text(prompt: str) -> list[int]:  # the tokenizer thread
        try:
            check_text(prompt)
        except ValidationError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        return tokenize(tok, prompt)

    def encode_chat(messages: list[dict]) -> list[int]:  # the tokenizer thread
        for i, m in enumerate(messages):
            try:
                check_text(m["content"], f"messages.{i}.content")
            except ValidationError as exc:
                raise APIError(400, str(exc), param=f"messages.{i}.content") from None
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenize(tok, text)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) > 1:
                raise APIError(400, f"one prompt per request is supported, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise APIError(400, "empty prompt", param="prompt")
        check_stop(body)
        ids = await off_loop(encode_text, prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", param="prompt")
        return await start(request, body, ids, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest):
        if not body.messages:
            raise APIError(400, "messages is empty", param="messages")
        if not getattr(tok, "chat_template", None):
            raise APIError(400, "the model has no chat template; use /v1/completions", param="messages")
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
        check_stop(body)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        ids = await off_loop(encode_chat, messages)
        return await start(request, body, ids, body.max_tokens or body.max_completion_tokens, chat=True)

    @app.get("/v1/models")
    async def models():
        card = {"id": settings.model_name, "object": "model", "created": created, "owned_by": "specfold"}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model_name, **engine.snapshot()}

    return app
