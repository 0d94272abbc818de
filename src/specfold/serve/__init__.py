"""``specfold serve``: an OpenAI-compatible HTTP server on the batched engine.

    from specfold.api import load_model
    from specfold.config import MethodConfig
    from specfold.serve import ServerConfig, serve
    serve(load_model(None), ServerConfig(port=8000, method="specfold", options=MethodConfig("specfold", delta=0.1)))

:mod:`~specfold.serve.app` is the HTTP layer, :mod:`~specfold.serve.engine` the worker thread that owns the model,
:mod:`~specfold.serve.schemas` the request bodies, :mod:`~specfold.serve.text` the streamed text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specfold.config import MethodConfig, MethodName
from specfold.model.loading import LoadedModel

__all__ = ["ServerConfig", "build_app", "engine_settings", "serve"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None  # the id clients name (default: the checkpoint directory's name)
    method: MethodName = MethodName.VANILLA  # the default method; a request may ask for another
    # The speculation options (graph, budget, depth, delta, backend, ffn, attention); every method, the default and
    # those requests ask for, takes the ones that apply to it. delta: the δ of a specfold request that gives none.
    options: MethodConfig = field(default_factory=lambda: MethodConfig(MethodName.SPECFOLD))
    max_batch: int = 8  # requests decoded together
    max_queue: int = 64  # requests waiting beyond them; more get 429
    max_tokens: int = 256  # a request's default max_tokens
    threshold: float = 0.9
    block_size: int | None = None
    small_block_size: int | None | str = "auto"
    # A quota rule's passes per block and strategy (SDAR; refused at start-up for other families). Per server, not
    # per request: one continuous batch decodes every request of a method under one DecodeConfig.
    steps: int | None = None
    strategy: str | None = None
    cache: str | None = None  # LLaDA / Dream: Fast-dLLM v1's cache (per server as well)
    log_level: str = "info"
    max_body_bytes: int = 4 * 1024 * 1024  # a larger request body is answered 413 unread
    drain_seconds: float = 5.0  # on SIGTERM/SIGINT: how long open requests may still finish


def engine_settings(model: LoadedModel, config: ServerConfig):
    """The engine's settings for ``config``: the decoding parameters, and the method options with the draft graph
    resolved once (every method shares it; None when the model has none and the server decodes vanilla only) and
    specfold's δ explicit, so that each request's MethodConfig names it."""
    from specfold.api import decode_config_for, resolve_graph
    from specfold.serve.engine import EngineSettings

    cfg = decode_config_for(model, config.max_tokens, config.threshold, config.block_size, config.small_block_size,
                            steps=config.steps, strategy=config.strategy, cache=config.cache)
    method = MethodName(config.method)
    options = config.options.for_method(MethodName.SPECFOLD)
    try:
        graph = resolve_graph(model, options.graph, options.budget, options.depth)
    except ValueError:
        if method is not MethodName.VANILLA or options.graph is not None:
            raise
        graph = None
    options = replace(options, graph=graph, budget=None, depth=None, delta=options.fold.delta)
    return EngineSettings(cfg, options, method, config.max_batch, config.max_queue)


def build_app(model: LoadedModel, config: ServerConfig):
    """The FastAPI app serving ``model`` (its worker thread starts with the app's lifespan)."""
    from specfold.serve.app import AppSettings, create_app
    from specfold.serve.engine import ServeEngine

    engine = ServeEngine(model, engine_settings(model, config))
    settings = AppSettings(config.model_name or model.path.name, config.max_tokens, config.max_body_bytes)
    app = create_app(model, engine, settings)
    app.state.engine = engine
    return app


def serve(model: LoadedModel, config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then drain and return (:mod:`~specfold.serve.shutdown`): no new connection or
    request is taken,
    open requests finish for up to ``drain_seconds``, and those still open then end with an explicit error event
    (a stream's last ``data:`` is an error object; a non-streamed request gets 503) — never a silent cut. A second
    signal ends the drain at once (the same error events)."""
    import signal

    import uvicorn

    if config.drain_seconds < 0:
        raise ValueError(f"drain_seconds must be >= 0, got {config.drain_seconds}")
    if config.max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {config.max_body_bytes}")
    from specfold.serve.shutdown import DrainingServer

    app = build_app(model, config)
    engine = app.state.engine
    server = DrainingServer(
        uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                       timeout_graceful_shutdown=5),
        engine, config.drain_seconds,
    )
    # NOTE: after its graceful shutdown uvicorn re-raises the signal it caught under the handlers it found; with
    # these no-op handlers that ends here (exit status 0) instead of killing the process.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
