"""The server under faults: nothing silent, nothing that blocks (127.0.0.1 only, bounded loops).

* SIGTERM drains: every stream open at the signal ends with a ``finish_reason`` or an error event, a request
  that can finish within ``--drain-seconds`` does, and the exit status is 0;
* a body over ``--max-body-bytes`` is answered 413 unread while ``/health`` keeps answering within 100 ms, and a
  large prompt's tokenisation does not hold up ``/health`` either;
* a 429 carries ``Retry-After``; a non-streaming client that leaves logs no traceback; a stop string counts as
  ``finished``; text that is not Unicode scalar values, whitespace-only text and ``stop: ""`` are 400s.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time

import httpx
import pytest

from tests.serve.conftest import LONG_PROMPT, start_server

HEALTH_BUDGET_S = 0.1


@pytest.fixture(scope="module")
def small():
    """One decode slot and no queue: a second concurrent request gets 429."""
    srv = start_server("--max-batch", "1", "--max-queue", "0", "--max-body-bytes", "4000000")
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0
    err = srv.proc.stderr.read()
    assert "Traceback" not in err and "InvalidStateError" not in err, err[-3000:]


def health_latencies(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=5) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert c.get(f"{url}/health").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)


def while_polling_health(url: str, action):
    """``action()``'s value and the /health latencies seen meanwhile (a warm connection, polled every 10 ms)."""
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=health_latencies, args=(url, stop, seen))
    poller.start()
    time.sleep(0.2)
    try:
        value = action()
    finally:
        time.sleep(0.1)
        stop.set()
        poller.join(10)
    return value, seen


def test_a_10mb_body_is_refused_at_once_and_health_stays_fast(small):
    body = b'{"prompt": "' + b"x" * (10 * 1024 * 1024) + b'"}'

    def post():
        t0 = time.perf_counter()
        r = httpx.post(small.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=30)
        return r, time.perf_counter() - t0

    (r, took), seen = while_polling_health(small.url, post)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert "4000000 bytes" in r.json()["error"]["message"]
    assert seen and max(seen) < HEALTH_BUDGET_S, seen
    assert took < 5  # refused on its Content-Length, not after reading (and parsing) 10 MB

    def chunked():  # no Content-Length: refused once the bytes received pass the limit
        parts = (body[i : i + 65536] for i in range(0, len(body), 65536))
        return httpx.post(small.url + "/v1/completions", content=parts, headers={"content-type": "application/json"},
                          timeout=30)

    assert chunked().status_code == 413


def test_tokenising_a_large_prompt_does_not_hold_up_health(small):
    prompt = "word " * 600_000  # 3 MB of text: seconds of tokenisation, then refused for the position limit

    def post():
        return httpx.post(small.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=60)

    r, seen = while_polling_health(small.url, post)
    assert r.status_code == 400 and "position limit" in r.json()["error"]["message"]
    # NOTE: a percentile, not the max: on the shared 2-core test machine a lone poll can wait for a core
    p95 = statistics.quantiles(seen, n=20)[-1]
    assert len(seen) >= 10 and p95 < HEALTH_BUDGET_S and max(seen) < 10 * HEALTH_BUDGET_S, sorted(seen)[-10:]


def open_stream(url: str, body: dict, opened: threading.Event, events: list):
    """Read one SSE stream to its end, collecting its ``data:`` payloads; ``opened`` is set at the first one."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            events.append(("status", r.status_code))
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(("data", line[6:]))
                    opened.set()
    except httpx.HTTPError as exc:
        events.append(("transport", type(exc).__name__))
    finally:
        opened.set()


def test_a_429_says_when_to_retry(small):
    opened, events = threading.Event(), []
    t = threading.Thread(target=open_stream, args=(small.url, {"prompt": LONG_PROMPT, "max_tokens": 600}, opened,
                                                    events))
    t.start()
    try:
        assert opened.wait(30)
        r = httpx.post(small.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(r.headers["retry-after"]) <= 60
    finally:
        t.join(120)
    data = [d for kind, d in events if kind == "data"]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"], events[-4:]


def test_a_non_streaming_client_that_leaves_is_cancelled_without_a_traceback(small):
    before = small.health()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(small.url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 1500}, timeout=1.0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and small.health()["outstanding"]:
        time.sleep(0.05)
    after = small.health()
    assert after["outstanding"] == 0 and after["cancelled"] == before["cancelled"] + 1
    # the module fixture checks the server's stderr for tracebacks when it stops


def test_a_stop_string_counts_as_finished(small):
    full = httpx.post(small.url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 64}, timeout=60)
    text = full.json()["choices"][0]["text"]
    stop = text[10:14]
    assert len(stop) == 4 and text.find(stop) == 10
    before = small.health()
    r = httpx.post(small.url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 1500, "stop": stop},
                   timeout=60)
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["text"] == text[:10]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and small.health()["outstanding"]:
        time.sleep(0.05)
    after = small.health()
    assert (after["finished"], after["cancelled"]) == (before["finished"] + 1, before["cancelled"])


BAD_TEXT = [
    ("/v1/completions", b'{"prompt": "\\ud800 abc"}', "lone surrogate U+D800", "prompt"),
    ("/v1/completions", b'{"prompt": "ok \\udcff"}', "undecodable byte 0xff", "prompt"),
    ("/v1/completions", b'{"prompt": "  \\n\\t "}', "only whitespace", "prompt"),
    ("/v1/completions", b'{"prompt": ["\\udfff"]}', "lone surrogate U+DFFF", "prompt"),
    ("/v1/completions", b'{"prompt": "\xff\xfe abc"}', None, None),  # not UTF-8 at all: malformed JSON
    ("/v1/completions", b'{"prompt": "hi", "stop": ""}', "stop: a stop string must not be empty", "stop"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["x", ""]}', "stop: a stop string must not be empty", "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ""}]}', "messages.0.content is empty",
     "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "   "}]}', "only whitespace",
     "messages.0.content"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "system", "content": "\\ud800"}, {"role": "user", "content": "hi"}]}',
     "lone surrogate", "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc80"}]}]}',
     "undecodable byte 0x80", "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": "hi"}', None, "messages"),
]


@pytest.mark.parametrize(("path", "body", "message", "param"), BAD_TEXT, ids=[str(i) for i in range(len(BAD_TEXT))])
def test_bad_text_is_a_400(small, path, body, message, param):
    r = httpx.post(small.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    if message is not None:
        assert message in err["message"] and err["param"] == param, err
    elif param is not None:
        assert err["param"] == param, err


def test_sigterm_drains_and_every_open_stream_ends_explicitly():
    """Two streams that cannot finish within the drain (1,500 tokens) and one that can (24 tokens; a 4 s drain
    leaves room for it on a loaded CI machine): at SIGTERM the short one finishes
    (finish_reason, [DONE]), the long ones end with an error event naming the drain, a new request is refused,
    and the server exits 0 soon after the drain."""
    srv = start_server("--max-batch", "4", "--drain-seconds", "4")
    try:
        bodies = [{"prompt": LONG_PROMPT, "max_tokens": 1500}] * 2 + [{"prompt": "Hello", "max_tokens": 24}]
        runs = [(threading.Event(), []) for _ in bodies]
        threads = [threading.Thread(target=open_stream, args=(srv.url, b, o, e))
                   for b, (o, e) in zip(bodies, runs, strict=True)]
        for t in threads:
            t.start()
        assert all(o.wait(60) for o, _ in runs)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            late = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=5)
            assert late.status_code == 503
        except httpx.TransportError:
            pass  # the listener is closed: refused at connect
        for t in threads:
            t.join(60)
        code = srv.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    assert code == 0 and took < 4 + 10
    for (_, events), body in zip(runs, bodies, strict=True):
        data = [d for kind, d in events if kind == "data"]
        assert ("status", 200) in events and data, events
        if data[-1] == "[DONE]":
            last = json.loads(data[-2])
            assert last["choices"][0]["finish_reason"] in ("stop", "length")
            assert body["max_tokens"] == 24  # only the short one could finish
        else:
            err = json.loads(data[-1])["error"]
            assert err["code"] == "server_shutting_down" and "4 s drain" in err["message"], err
    short = [d for kind, d in runs[2][1] if kind == "data"]
    assert short[-1] == "[DONE]"


@pytest.fixture(scope="module")
def nan_ckpt(tmp_path_factory) -> str:
    """The embedded model (tokenizer and all) with one weight overwritten by NaN."""
    import shutil

    from safetensors.torch import load_file, save_file

    from specfold.model.embedded import EMBEDDED_DIR

    out = tmp_path_factory.mktemp("nan_ckpt")
    for f in EMBEDDED_DIR.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = load_file(EMBEDDED_DIR / "model.safetensors")
    weights["model.layers.0.mlp.down_proj.weight"].fill_(float("nan"))
    save_file(weights, out / "model.safetensors")
    return str(out)


def test_nan_weights_are_one_line_in_the_cli_and_an_error_in_the_server(nan_ckpt: str, capsys):
    from specfold.cli import main

    code = main(["generate", "--model", nan_ckpt, "Hello", "--max-new-tokens", "8"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "non-finite logits" in err and "float32" in err, err
    srv = start_server("--model", nan_ckpt)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8}, timeout=60)
        assert r.status_code == 500 and "non-finite logits" in r.json()["error"]["message"]
        opened, events = threading.Event(), []
        open_stream(srv.url, {"prompt": "Hello", "max_tokens": 8}, opened, events)
        data = [d for kind, d in events if kind == "data"]
        assert "non-finite logits" in json.loads(data[-1])["error"]["message"]
        assert srv.health()["failed"] == 2 and srv.health()["outstanding"] == 0
    finally:
        assert srv.stop() == 0
    log = srv.proc.stderr.read()
    assert "Traceback" not in log and log.count("non-finite logits") == 2, log[-3000:]
