"""A bounded load test of ``specfold serve``, compared with ``specfold eval --batch-size`` on the same prompts.

What it does, in order (loopback only; it stops by itself):

1. starts ``specfold serve`` as a subprocess on 127.0.0.1 (a free port), waits for ``GET /health``;
2. sends one warm-up request (not measured), then runs ``--clients`` concurrent clients (the real ``openai``
   client, ``AsyncOpenAI``, ``stream=True``), each sending ``--requests-per-client`` requests one after another;
   request ``i`` carries the prompt of sample ``i`` of ``--task`` (the first ``clients × requests-per-client``
   samples, exactly the ones ``specfold eval --limit N`` decodes), with ``max_tokens = --max-tokens``;
3. checks every request was answered exactly once: each stream ends with one ``finish_reason`` (stop / length)
   and the specfold extension, its text deltas concatenate to the text of its token ids, no response id (the
   server's job id) repeats, and the server's ``/health`` counters say submitted = finished, nothing cancelled,
   failed or rejected; records latency (submit → last chunk) and time to first token (submit → first non-empty
   text delta);
4. stops the server with SIGTERM and checks its exit status is 0;
5. decodes the same prompts with ``specfold eval --tasks TASK --limit N --batch-size MAX_BATCH --methods METHOD``
   (a subprocess, same max tokens and decoding settings, same ``--threads``), reads its records, and compares the
   token ids answer by answer (for vanilla they should all agree) and the throughput.

Throughput figures (all "generated tokens"):

* ``server_tokens_per_second`` = total generated tokens ÷ wall seconds from the first submit to the last answer
  (the load the clients saw: HTTP, SSE, queueing, batching);
* ``eval_tokens_per_second`` = the same tokens ÷ the wall seconds of eval's continuous-batch decode (the records'
  ``wall_seconds`` summed: model loading and eval's warm-up left out), eval's summary ``tokens_per_second``;
* ``ratio`` = server ÷ eval;
* ``*_per_request_tokens_per_second``: Σ tokens ÷ Σ per-request decode seconds (with batching the rate of one
  request's stream, not the total), for eval from its records' ``seconds`` and for the server from its
  ``decode_seconds``.

The prompts go through the chat endpoint as one user message, which the server turns into the same token ids as
eval's chat template (``--endpoint completions`` sends eval's token ids instead; ``--no-chat`` sends the raw
prompt text to the completions endpoint, as ``eval --no-chat`` encodes it).

Output: one JSON line on stdout (and in ``--out``), a short table on stderr; exit status 0 when every request was
answered exactly once, the server exited with 0 and eval succeeded, else 1. Example (a few seconds)::

    python scripts/serve_load.py --clients 4 --requests-per-client 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from specfold.config import MethodName

SRC = Path(__file__).resolve().parents[1] / "src"

# `specfold eval` with its one batched decode timed: the real command, plus one JSON line on stderr.
def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="serve_load.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("load")
    g.add_argument("--clients", metavar="N", type=positive_int, default=32,
                   help="concurrent streaming clients (default 32)")
    g.add_argument(
        "--requests-per-client", metavar="N", type=positive_int, default=4,
        help="requests each client sends, one after another (default 4)",
    )
    g.add_argument("--task", metavar="TASK", default="synth-math",
                   help="eval task whose prompts are sent (default synth-math)")
    g.add_argument("--split", default="test", help="its split (default test)")
    g.add_argument(
        "--endpoint", choices=["chat", "completions"], default="chat",
        help="chat: the prompt as one user message (the server applies the chat template, as eval does); "
        "completions: eval's token ids as the prompt (default chat)",
    )
    g.add_argument("--no-chat", action="store_true", help="no chat template: raw prompt text, eval --no-chat")
    g.add_argument(
        "--timeout", metavar="S", type=float, default=600.0,
        help="seconds for the whole load phase (default 600): requests still open then are cancelled and count "
        "as lost",
    )
    g.add_argument(
        "--max-retries", metavar="N", type=int, default=0,
        help="the openai client's max_retries (default 0: a 429 counts as lost; 2 is the client's own default, "
        "which waits as the server's Retry-After says)",
    )
    s = p.add_argument_group("server and eval (the same settings for both)")
    s.add_argument("--max-batch", metavar="N", type=positive_int, default=8,
                   help="serve --max-batch and eval --batch-size (default 8)")
    s.add_argument("--max-queue", metavar="N", type=int, default=None,
                   help="serve --max-queue (default: enough for every client, so none gets 429)")
    s.add_argument("--method", choices=[m.value for m in MethodName], default="vanilla",
                   help="decoding method (default vanilla; eval batches every method the same way)")
    s.add_argument("--delta", metavar="D", type=float, default=None, help="specfold δ (server and eval)")
    s.add_argument("--max-tokens", metavar="N", type=positive_int, default=64,
                   help="max_tokens of every request = eval --max-new-tokens (default 64)")
    s.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the embedded model)")
    s.add_argument("--dtype", default=None, help="serve/eval --dtype (default: theirs, fp32)")
    s.add_argument("--device", default=None, help="serve/eval --device (default: theirs, cpu)")
    s.add_argument("--threads", metavar="N", type=positive_int, default=1,
                   help="specfold --threads for the server and for eval (default 1: comparable figures, and "
                   "the clients keep a core of their own)")
    s.add_argument("--startup-timeout", metavar="S", type=float, default=120.0,
                   help="seconds to wait for /health, and for the warm-up request (120)")
    s.add_argument("--eval-timeout", metavar="S", type=float, default=600.0, help="seconds for the eval run (600)")
    s.add_argument("--no-eval", action="store_true", help="the load test only (no eval run, no comparison)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="also write the JSON line to this file")
    o.add_argument("--eval-out", default=None, help="keep eval's JSONL records here (default: a temporary file)")
    o.add_argument("--server-log", default=None, help="keep the server's stderr here (default: a temporary file)")
    return p


# -- the server ------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """The environment of the subprocesses: this checkout's src first (when run from one)."""
    env = dict(os.environ)
    if SRC.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


def shared_args(args: argparse.Namespace) -> list[str]:
    """The options the server and eval must share so that they decode alike."""
    out = ["--max-new-tokens", str(args.max_tokens)]
    for flag in ("model", "dtype", "device"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag}", value]
    return out


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text()[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM; the exit status (killed after ``timeout``: -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9


def start_server(args: argparse.Namespace, log: Path) -> Server:
    import httpx

    port = free_port()
    max_queue = args.max_queue if args.max_queue is not None else max(64, args.clients)
    cmd = [
        sys.executable, "-m", "specfold.cli", "--threads", str(args.threads), "serve", "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning", "--max-batch", str(args.max_batch),
        "--max-queue", str(max_queue), "--method", args.method, *shared_args(args),
    ]
    if args.delta is not None:
        cmd += ["--delta", str(args.delta)]
    handle = open(log, "w")
    proc = subprocess.Popen(cmd, env=child_env(), stdout=handle, stderr=subprocess.STDOUT, text=True)
    handle.close()
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + args.startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"specfold serve exited with {proc.returncode}: {server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"specfold serve did not answer /health within {args.startup_timeout:g} s")


# -- the clients -----------------------------------------------------------------------------------------------


@dataclass
class Prompt:
    sample_id: str
    text: str
    ids: list[int] | None = None  # eval's token ids (the completions endpoint)


@dataclass
class Answer:
    """One request as its client saw it."""

    tag: str  # client/request, e.g. "c3r1"
    index: int  # the prompt's index = the eval sample's
    submitted: float
    first_token: float | None = None
    last_chunk: float | None = None
    text: str = ""
    finishes: list[str] = field(default_factory=list)  # finish_reason of every chunk that had one
    extension: dict | None = None
    response_ids: set[str] = field(default_factory=set)
    prompt_tokens: int | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None and len(self.finishes) >= 1 and self.extension is not None

    @property
    def token_ids(self) -> list[int]:
        return list((self.extension or {}).get("token_ids") or [])


def request_body(args: argparse.Namespace, prompt: Prompt) -> dict:
    body: dict = {"max_tokens": args.max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if args.endpoint == "chat" and not args.no_chat:
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.ids if prompt.ids is not None else prompt.text
    extra = {"method": args.method}
    if args.delta is not None:
        extra["delta"] = args.delta
    body["extra_body"] = extra
    return body


async def one_request(client, args: argparse.Namespace, model: str, prompt: Prompt, answer: Answer) -> None:
    body = request_body(args, prompt)
    chat = "messages" in body
    try:
        create = client.chat.completions.create if chat else client.completions.create
        stream = await create(model=model, **body)
        async for chunk in stream:
            now = time.perf_counter()
            answer.last_chunk = now
            answer.response_ids.add(chunk.id)
            if chunk.usage is not None:
                answer.prompt_tokens = chunk.usage.prompt_tokens
            for choice in chunk.choices:
                delta = (choice.delta.content if chat else choice.text) or ""
                if delta and answer.first_token is None:
                    answer.first_token = now
                if answer.finishes and delta:  # text after the end: a duplicated answer
                    answer.finishes.append("text-after-finish")
                answer.text += delta
                if choice.finish_reason is not None:
                    answer.finishes.append(choice.finish_reason)
                    answer.extension = (chunk.model_extra or {}).get("specfold")
    except Exception as exc:  # noqa: BLE001 - a failed request is counted, not raised
        answer.error = f"{type(exc).__name__}: {exc}"[:300]


async def run_clients(args: argparse.Namespace, url: str, model: str, prompts: list[Prompt]) -> tuple[list, float]:
    """Every client's answers (in prompt order) and the wall seconds of the load (first submit → last answer)."""
    import httpx
    from openai import AsyncOpenAI

    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
    async with AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=args.max_retries, timeout=args.timeout,
        http_client=httpx.AsyncClient(limits=limits, timeout=args.timeout),
    ) as client:
        warm = Answer("warm-up", -1, time.perf_counter())
        await one_request(client.with_options(timeout=args.startup_timeout), args, model, prompts[0], warm)
        if not warm.answered:
            raise RuntimeError(f"the warm-up request failed: {warm.error or warm.finishes}")

        answers: list[Answer | None] = [None] * len(prompts)

        async def client_loop(c: int) -> None:
            for r in range(args.requests_per_client):
                i = c * args.requests_per_client + r
                answers[i] = Answer(f"c{c}r{r}", i, time.perf_counter())
                await one_request(client, args, model, prompts[i], answers[i])

        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(client_loop(c)) for c in range(args.clients)]
        done, pending = await asyncio.wait(tasks, timeout=args.timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        ends = [a.last_chunk for a in answers if a is not None and a.last_chunk is not None]
        wall = (max(ends) if ends else time.perf_counter()) - t0
        for i, a in enumerate(answers):
            if a is None:
                c, r = divmod(i, args.requests_per_client)
                answers[i] = Answer(f"c{c}r{r}", i, t0, error=f"not sent within the {args.timeout:g} s timeout")
            elif not a.answered and a.error is None:
                a.error = f"no answer within the {args.timeout:g} s timeout"
        return answers, wall


# -- eval ------------------------------------------------------------------------------------------------------


def run_eval(args: argparse.Namespace, n: int, out: Path) -> tuple[dict[str, dict], float, dict]:
    """Eval's records by sample id, its batched-decode wall seconds, and its summary row."""
    cmd = [
        sys.executable, "-m", "specfold.cli", "--threads", str(args.threads), "eval", "--tasks", args.task,
        "--split", args.split, "--limit", str(n), "--batch-size", str(args.max_batch), "--methods", args.method,
        "--out", str(out), "--overwrite", "--json", *shared_args(args),
    ]
    if args.delta is not None:
        cmd += ["--delta", str(args.delta)]
    if args.no_chat:
        cmd.append("--no-chat")
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=args.eval_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"specfold eval exited with {proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    row = next(iter(summary[args.task].values()))
    records = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        records[rec["sample_id"]] = rec
    seconds = sum(r["wall_seconds"] for r in records.values())  # the batch's wall time, shared out per record
    row["per_request_tokens_per_second"] = (sum(r["generated_tokens"] for r in records.values())
                                            / sum(r["seconds"] for r in records.values()))
    return records, seconds, row


# -- the report ------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """:func:`specfold.timing.percentile` (linear interpolation), None without values."""
    from specfold.timing import percentile as interpolated

    return interpolated(values, q) if values else None


def load_prompts(args: argparse.Namespace, n: int) -> list[Prompt]:
    from specfold.eval.harness import load_task

    samples = load_task(args.task, args.split, n).samples
    if len(samples) < n:
        raise SystemExit(
            f"serve_load.py: error: {args.task}/{args.split} has {len(samples)} samples; "
            f"--clients × --requests-per-client = {n} needs as many"
        )
    prompts = [Prompt(s.sample_id, s.prompt) for s in samples]
    if args.endpoint == "completions" and not args.no_chat:
        from specfold.api import encode_prompt

        tok, path = tokenizer(args)
        for p in prompts:  # encode_prompt reads only the tokenizer (and the path, for its error message)
            p.ids = encode_prompt(SimpleNamespace(tokenizer=tok, path=path), p.text, chat=True)
    return prompts


def tokenizer(args: argparse.Namespace):
    """The checkpoint's tokenizer (the one the server and eval use) and the checkpoint's directory."""
    from specfold.model.embedded import embedded_model_dir
    from specfold.model.loading import load_tokenizer, resolve_checkpoint

    path = resolve_checkpoint(args.model) if args.model else embedded_model_dir()
    return load_tokenizer(path), path


def report(args, prompts, answers, wall, health, server_exit, eval_records, eval_seconds, eval_row) -> dict:
    n = len(prompts)
    done = [a for a in answers if a.answered]
    job_ids: dict[str, int] = {}
    for a in done:
        for rid in a.response_ids:
            job_ids[rid] = job_ids.get(rid, 0) + 1
    duplicates = sum(len(a.finishes) - 1 for a in done) + sum(c - 1 for c in job_ids.values())
    duplicates += sum(len(a.response_ids) - 1 for a in done)  # one stream, one response id
    latency = [a.last_chunk - a.submitted for a in done]
    ttft = [a.first_token - a.submitted for a in done if a.first_token is not None]
    tokens = sum(len(a.token_ids) for a in done)
    decode_seconds = sum((a.extension or {}).get("decode_seconds") or 0.0 for a in done)
    tok, _ = tokenizer(args)
    text_ok = sum(a.text == tok.decode(a.token_ids, skip_special_tokens=True) for a in done) if tok else None
    agree, prompt_agree = 0, 0
    for a in done:
        rec = eval_records.get(prompts[a.index].sample_id)
        if rec is not None:
            agree += a.token_ids == rec["token_ids"]
            prompt_agree += a.prompt_tokens == rec["prompt_tokens"]
    eval_tokens = sum(r["generated_tokens"] for r in eval_records.values()) if eval_records else None
    server_tps = tokens / wall if wall > 0 else None
    eval_tps = eval_tokens / eval_seconds if eval_seconds else None
    errors = [f"{a.tag}: {a.error}" for a in answers if a.error]
    counters_ok = (
        health is not None and health.get("finished") == health.get("submitted") == n + 1
        and not health.get("cancelled") and not health.get("failed") and not health.get("rejected")
    )
    result = {
        "task": args.task,
        "endpoint": "completions" if args.no_chat else args.endpoint,
        "method": args.method,
        "clients": args.clients,
        "requests_per_client": args.requests_per_client,
        "max_batch": args.max_batch,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "requests": n,
        "answered": len(done),
        "duplicates": duplicates,
        "lost": n - len(done),
        "finish_reasons": {r: sum(a.finishes[:1] == [r] for a in done) for r in ("stop", "length")},
        "text_matches_tokens": text_ok,
        "server_counters": health,
        "server_counters_ok": counters_ok,
        "server_exit": server_exit,
        "latency_p50_s": percentile(latency, 50),
        "latency_p95_s": percentile(latency, 95),
        "latency_max_s": max(latency) if latency else None,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "generated_tokens": tokens,
        "wall_s": wall,
        "server_tokens_per_second": server_tps,
        "eval_generated_tokens": eval_tokens,
        "eval_decode_s": eval_seconds,
        "eval_tokens_per_second": eval_tps,
        "ratio": server_tps / eval_tps if server_tps and eval_tps else None,
        "server_per_request_tokens_per_second": tokens / decode_seconds if decode_seconds else None,
        "eval_per_request_tokens_per_second": eval_row.get("per_request_tokens_per_second"),
        "token_agreement": agree if eval_records else None,
        "prompt_tokens_agreement": prompt_agree if eval_records else None,
        "errors": errors[:10],
    }
    result["ok"] = bool(
        result["answered"] == n and result["duplicates"] == 0 and result["lost"] == 0 and server_exit == 0
        and counters_ok and text_ok in (None, len(done))
    )
    return result


def table(r: dict) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    def d(v):
        return "-" if v is None else str(v)

    rows = [
        ("requests / answered / lost / duplicated", f"{r['requests']} / {r['answered']} / {r['lost']} / "
         f"{r['duplicates']}"),
        ("finish reasons", ", ".join(f"{k} {v}" for k, v in r["finish_reasons"].items())),
        ("server exit status / counters ok", f"{r['server_exit']} / {r['server_counters_ok']}"),
        ("latency p50 / p95 / max (s)", f"{f(r['latency_p50_s'])} / {f(r['latency_p95_s'])} / "
         f"{f(r['latency_max_s'])}"),
        ("time to first token p50 / p95 (s)", f"{f(r['ttft_p50_s'])} / {f(r['ttft_p95_s'])}"),
        ("generated tokens: server / eval", f"{r['generated_tokens']} / {d(r['eval_generated_tokens'])}"),
        ("wall (s): server load / eval batch", f"{f(r['wall_s'])} / {f(r['eval_decode_s'])}"),
        ("total tokens/s: server / eval (ratio)", f"{f(r['server_tokens_per_second'], '.1f')} / "
         f"{f(r['eval_tokens_per_second'], '.1f')} ({f(r['ratio'], '.2f')})"),
        ("per-request tokens/s: server / eval", f"{f(r['server_per_request_tokens_per_second'], '.1f')} / "
         f"{f(r['eval_per_request_tokens_per_second'], '.1f')}"),
        ("same tokens as eval / same prompt length", f"{d(r['token_agreement'])} / {d(r['prompt_tokens_agreement'])} "
         f"of {r['answered']}"),
    ]
    w = max(len(k) for k, _ in rows)
    head = (f"specfold serve load: {r['clients']} clients × {r['requests_per_client']} requests, {r['method']}, "
            f"{r['task']} via {r['endpoint']}, max_tokens {r['max_tokens']}, max batch {r['max_batch']}, "
            f"threads {r['threads']}")
    lines = [head] + [f"  {k:<{w}}  {v}" for k, v in rows] + [f"  error: {e}" for e in r["errors"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if str(SRC) not in sys.path and SRC.is_dir():
        sys.path.insert(0, str(SRC))
    n = args.clients * args.requests_per_client
    prompts = load_prompts(args, n)
    with tempfile.TemporaryDirectory(prefix="serve_load.") as tmp:
        log = Path(args.server_log or Path(tmp) / "server.log")
        server = start_server(args, log)
        health = None
        try:
            import httpx

            model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
            answers, wall = asyncio.run(run_clients(args, server.url, model, prompts))
            health = httpx.get(f"{server.url}/health", timeout=10).json()
            health = {k: health[k] for k in ("submitted", "finished", "cancelled", "failed", "rejected")}
        finally:
            server_exit = server.stop()
        if server_exit != 0:
            print(f"server log tail:\n{server.log_tail()}", file=sys.stderr)
        records, eval_seconds, eval_row = {}, None, {}
        if not args.no_eval:
            records, eval_seconds, eval_row = run_eval(args, n, Path(args.eval_out or Path(tmp) / "eval.jsonl"))
        result = report(args, prompts, answers, wall, health, server_exit, records, eval_seconds, eval_row)
    line = json.dumps(result)
    print(table(result), file=sys.stderr)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
