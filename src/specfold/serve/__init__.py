"""``specfold serve``: an OpenAI-compatible HTTP server on the batched engine.

    from specfold.api import load_model
    from specfold.serve import ServerConfig, serve
    serve(load_model(None), ServerConfig(port=8000, method="specfold", delta=0.1))

:mod:`~specfold.serve.app` is the HTTP layer, :mod:`~specfold.serve.engine` the worker thread that owns the model,
:mod:`~specfold.serve.schemas` the request bodies, :mod:`~specfold.serve.text` the streamed text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specfold.model.loading import LoadedModel

__all__ = ["ServerConfig", "build_app", "serve"]

DEFAULT_DELTA = 0.1  # specfold's δ when neither the server nor the request gives one


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None  # the id clients name (default: the checkpoint directory's name)
    method: str = "vanilla"  # the default method; a request may ask for another
    delta: float | None = DEFAULT_DELTA  # specfold's default δ (None: DEFAULT_DELTA)
    max_batch: int = 8  # requests decoded together
    max_queue: int = 64  # requests waiting beyond them; more get 429
    max_tokens: int = 256  # a request's default max_tokens
    threshold: float = 0.9
    block_size: int | None = None
    small_block_size: int | None | str = "auto"
    graph: str | Path | None = None
    budget: int | None = None
    depth: int | None = None
    backend: str = "torch"
    ffn: str = "residual"
    attention: str = "auto"
    log_level: str = "info"


def build_app(model: LoadedModel, config: ServerConfig):
    """The FastAPI app serving ``model`` (its worker thread starts with the app's lifespan)."""
    from specfold.api import decode_config_for, resolve_graph
    from specfold.serve.app import AppSettings, create_app
    from specfold.serve.engine import EngineSettings, MethodKey, MethodOptions, ServeEngine

    cfg = decode_config_for(model, config.max_tokens, config.threshold, config.block_size, config.small_block_size)
    try:
        graph = resolve_graph(model, config.graph, config.budget, config.depth)
    except ValueError:
        if config.method != "vanilla" or config.graph is not None:
            raise
        graph = None  # no draft graph: the server decodes vanilla only
    options = MethodOptions(graph, config.backend, config.ffn, config.attention)
    delta = DEFAULT_DELTA if config.delta is None else config.delta  # the CLI passes None when --delta is not given
    default = MethodKey(config.method, delta if config.method == "specfold" else None)
    engine = ServeEngine(model, EngineSettings(cfg, default, options, config.max_batch, config.max_queue))
    name = config.model_name or model.path.name
    return create_app(model, engine, AppSettings(name, config.max_tokens, delta))


def serve(model: LoadedModel, config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then return: uvicorn stops accepting, gives open requests a few seconds, and
    the engine's worker stops with the app."""
    import signal

    import uvicorn

    app = build_app(model, config)
    # NOTE: after its graceful shutdown uvicorn re-raises the signal it caught under the handlers it found; with
    # these no-op handlers that ends here (exit status 0) instead of killing the process.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, timeout_graceful_shutdown=5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
