"""``specfold serve``: an OpenAI-compatible HTTP server (completions, chat, streaming) on the batched engine."""

from __future__ import annotations

import argparse

from specfold.cli.common import (
    METHOD_FLAGS,
    add_cache_arg,
    add_decode_args,
    add_method_args,
    add_model_args,
    add_quota_args,
    given_method_options,
    load_from_args,
    non_negative_float,
    positive_int,
)
from specfold.config import MethodConfig, MethodName


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 0..65535, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server with streaming",
        description="Serve POST /v1/completions, POST /v1/chat/completions, GET /v1/models and GET /health "
        "(OpenAI formats, Server-Sent Events with stream: true) through one continuous batch. A request may ask "
        "for another method or delta with the extra body fields 'method' and 'delta'.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--served-model-name", default=None, help="the model id clients use (default: checkpoint name)")
    p.add_argument("--max-batch", type=positive_int, default=8, help="requests decoded together (default 8)")
    p.add_argument(
        "--max-queue", type=_non_negative_int, default=64,
        help="requests waiting beyond --max-batch (default 64); more concurrent requests get 429",
    )
    p.add_argument(
        "--max-body-bytes", type=positive_int, default=4 * 1024 * 1024,
        help="a larger request body is answered 413 before it is read (default 4 MiB)",
    )
    p.add_argument(
        "--drain-seconds", type=non_negative_float, default=5.0,
        help="on SIGTERM/SIGINT: stop taking requests, let open ones finish for this long, then end the rest "
        "with an error event (default 5)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_model_args(p)
    add_decode_args(p)
    add_quota_args(p)  # per server: every request decodes under the server's rule
    add_cache_arg(p)
    add_method_args(p, "method", [o for o in METHOD_FLAGS if o != "lookahead"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specfold.serve import ServerConfig, serve

    # Every option applies to a method some request may ask for (--delta is specfold's δ on a vanilla server too),
    # so none is refused here: each method takes those that apply to it.
    options = MethodConfig(MethodName.SPECFOLD, **given_method_options(args))
    model = load_from_args(args)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        model_name=args.served_model_name,
        method=MethodName(args.method),
        options=options,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_tokens=args.max_new_tokens,
        threshold=args.threshold,
        block_size=args.block_size,
        small_block_size=args.small_block_size,
        steps=args.steps,
        strategy=args.strategy,
        cache=args.cache,
        log_level=args.log_level,
        max_body_bytes=args.max_body_bytes,
        drain_seconds=args.drain_seconds,
    )
    serve(model, config)
    return 0
