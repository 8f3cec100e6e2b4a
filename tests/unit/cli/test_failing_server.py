"""A server that fails every request is a failed run, not a saturated one.

Stub servers on 127.0.0.1 (http.server, in a thread of this process) answer /health, /v1/models
and the prefix-cache reset like vLLM, and each measured request with one kind of failure.  Each
stub's serving thread ends with its test: a loop left polling a closed socket spins a core for as
long as the test process lives, under every test that comes after it.  The real
CLI runs against them in a subprocess: every request is a row with its error, every point is
`failed` (not SATURATED), the error reaches the console once per point, in one line, and the run
exits 1 naming the first error.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import forkcli

REPO = Path(__file__).resolve().parents[3]
N = 6  # measured requests per point


def _sse(*events: bytes) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events)


def completions(h: BaseHTTPRequestHandler, kind: str) -> None:
    """Answer one POST /v1/completions with failure ``kind``."""
    def reply(status: int, ctype: str, body: bytes, **headers) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    token = json.dumps({"choices": [{"text": "x", "token_ids": [5]}]}).encode()
    if kind == "good":  # four tokens, then usage, as vLLM streams them
        usage = json.dumps({"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}})
        reply(200, "text/event-stream", _sse(token, token, token, token, usage.encode(), b"[DONE]"))
    elif kind == "long":  # six tokens where four were asked
        usage = json.dumps({"choices": [], "usage": {"completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 0}}})
        reply(200, "text/event-stream", _sse(*[token] * 6, usage.encode(), b"[DONE]"))
    elif kind == "bundled":  # the four tokens in two events without token_ids; usage counts four
        text = json.dumps({"choices": [{"text": "xx"}]}).encode()
        usage = json.dumps({"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 0}}})
        reply(200, "text/event-stream", _sse(text, text, usage.encode(), b"[DONE]"))
    elif kind == "http500":
        reply(500, "text/plain", b"Internal Server Error: out of cheese\n")
    elif kind == "bad_json":
        reply(200, "text/event-stream", _sse(b"{not json", b"[DONE]"))
    elif kind == "not_sse":
        reply(200, "application/json", json.dumps({"choices": [{"text": "xx"}]}).encode())
    elif kind == "html_login":
        reply(200, "text/html; charset=utf-8", b"<html><head><title>Sign in</title></head><body>login</body></html>")
    elif kind == "sse_error":
        reply(200, "text/event-stream", _sse(json.dumps({"error": {"message": "model overloaded", "code": 503}}).encode()))
    elif kind == "redirect_loop":
        reply(302, "text/plain", b"", Location="/v1/completions")
    elif kind == "mid_stream_close":
        body = _sse(token)  # one token of the four, then the connection goes
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Content-Length", str(len(body) + 1000))
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()
        h.close_connection = True
    else:
        raise AssertionError(kind)


STUB_THREAD = "failing-server-stub"


@pytest.fixture(autouse=True)
def no_stub_outlives_its_test():
    yield
    left = [t for t in threading.enumerate() if t.name == STUB_THREAD]
    for t in left:
        t.join(5)
    assert not [t for t in left if t.is_alive()], "a stub server's loop is still running after its test"


@contextmanager
def stub(kind: str, die_after: int | None = None) -> Iterator[ThreadingHTTPServer]:
    """A stub server serving in a thread of this process, stopped on leaving the block.
    ``die_after``: the server stops listening once it has answered that many completions (each
    on its own connection, so none lives on in a pooled one)."""
    answered = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _json(self, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._json({})
            elif self.path == "/v1/models":
                self._json({"data": [{"id": "stub"}]})
            else:
                self.send_error(404)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.split("?")[0] == "/reset_prefix_cache":  # vLLM takes ?reset_external=true
                self._json({"success": True})
            elif self.path == "/v1/completions":
                completions(self, kind)
                if die_after is not None:
                    self.close_connection = True
                    answered.append(1)
                    if len(answered) == die_after:
                        # Nothing listens from now on: a new connection is refused at once, not
                        # queued.  The serving loop would poll the closed socket without pause, so
                        # it is stopped too (shutdown waits for it: not from its own thread).
                        server.socket.close()
                        threading.Thread(target=server.shutdown, daemon=True).start()
            else:
                self.send_error(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=STUB_THREAD, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()  # returns once the loop has ended (at once if it already has)
        server.server_close()


# kind -> the error every measured request's row carries
ERRORS = {
    "http500": "HTTP 500: Internal Server Error: out of cheese",
    "bad_json": "invalid JSON in the stream: {not json",
    "not_sse": 'not an SSE stream (Content-Type application/json): {"choices": [{"text": "xx"}]}',
    "html_login": "not an SSE stream (Content-Type text/html; charset=utf-8): "
                  "<html><head><title>Sign in</title></head><body>login</body></html>",
    "sse_error": "server error: {'message': 'model overloaded', 'code': 503}",
    "redirect_loop": "HTTP 302: redirected to /v1/completions; give the server's own base URL",
    "mid_stream_close": "connection closed mid-stream after 1 of 4 tokens",
    "long": "long output: 6 tokens, 4 asked",
}


def run_against(tmp: Path, kind: str, *flags, prime: bool = False) -> tuple[subprocess.CompletedProcess, Path]:
    with stub(kind) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = tmp / "c.yaml"
        cfg.write_text(yaml.safe_dump({
            "study": "dead", "executor": "local", "out": str(tmp / "res"),
            "engine": {"kind": "http", "targets": {"on": url, "off": url}, "block_size": 16, "metrics_path": None},
            "dataset": {"num_requests": N, "prefix_len": 32, "suffix_len": 4, "output_len": 4},
            "sweep": {"rates": [20], "num_requests": N, "warmup_requests": 0, "prime_prefixes": prime,
                      "request_timeout_s": 10},
        }))
        r = forkcli.run(["run", cfg, "--quiet", *flags], cwd=REPO, timeout=180)
    (d,) = (tmp / "res" / "dead").iterdir()
    return r, d


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(ERRORS))
def test_a_server_failing_every_request_is_a_failed_run(tmp_path, kind):
    r, d = run_against(tmp_path, kind, "--no-report")
    err = ERRORS[kind]
    assert r.returncode == 1, r.stderr
    why = f"{N} of {N} requests failed: {err} ({N}x)"
    assert r.stdout.splitlines()[:2] == [
        f"[ ON     20 req/s] ok 0/{N}  e2e - ms  prefill - ms  hit nan  FAILED: {why}",
        f"[OFF     20 req/s] ok 0/{N}  e2e - ms  prefill - ms  hit nan  FAILED: {why}",
    ]
    # A server that answers the cold-start probe but reports no hits (this one never caches) is
    # said once; one that fails the probe too leaves its requests to tell (runner.cold).
    unverified = ("warning: cache ON: the cold-start probe sees no cache hits here, so its reset is not verified "
                  "(manifest: cold_probe)\n") if kind == "long" else ""
    assert r.stderr == (f"{unverified}error: 2 point(s) failed, the first: cache ON @ 20 req/s: {why}; "
                        f"run them again with: prefixstudy run --resume {d}\n")
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "complete_with_failures"
    assert [p["cold_probe"] for p in m["points"]] == ["unverified" if kind == "long" else "probe failed",
                                                      "caching off"]
    assert [(p["status"], p["saturated"], p["error"]) for p in m["points"]] == [("failed", False, why)] * 2
    req = pd.read_parquet(d / "requests.parquet")
    assert len(req) == 2 * N and req["error"].tolist() == [err] * (2 * N)
    s = pd.read_csv(d / "summary.csv")
    assert s["status"].tolist() == ["failed", "failed"] and s["n_failed"].tolist() == [N, N]
    assert not s["saturated"].any()


@pytest.mark.slow
def test_tokens_counted_but_not_streamed_are_flagged_and_get_no_made_up_gaps(tmp_path):
    r, d = run_against(tmp_path, "bundled", "--no-report")
    assert r.returncode == 0, r.stderr
    warn = ("counted more completion tokens than it streamed for 6 requests; their token counts are the "
            "server's and their ITL is not measured (no token_ids in its stream, several tokens an event)")
    said = [ln for ln in r.stderr.splitlines() if warn in ln]
    assert len(said) == 2 and all(ln.startswith("warning: http://127.0.0.1:") for ln in said), r.stderr  # once a point
    m = json.loads((d / "manifest.json").read_text())
    assert [p["requests_with_unstreamed_tokens"] for p in m["points"]] == [N, N]
    assert [p["itl_ms"] for p in m["points"]] == [{}, {}]  # the pooled gaps leave them out too
    req = pd.read_parquet(d / "requests.parquet")
    assert (req["error"] == "").all() and (req["output_tokens"] == 4).all()
    assert req["itl_mean_ms"].isna().all() and req["itl_p99_ms"].isna().all()  # not zeros made up
    # E2E and TPOT stay measured from the events that came (one read or two: the stub writes at once).
    assert (req["e2e_ms"] >= req["ttft_ms"]).all() and req["tpot_ms"].notna().all()


@pytest.mark.slow
def test_a_failed_prime_fails_its_point_and_keeps_its_planned_requests_as_rows(tmp_path):
    r, d = run_against(tmp_path, "http500", "--no-report", prime=True)
    assert r.returncode == 1, r.stderr
    why = "priming group 0 failed (HTTP 500: Internal Server Error: out of cheese)"
    assert r.stdout.splitlines()[0] == f"[ ON     20 req/s] ok 0/{N}  e2e - ms  prefill - ms  hit nan  FAILED: {why}"
    m = json.loads((d / "manifest.json").read_text())
    assert [(p["status"], p["error"], p["accounting_ok"]) for p in m["points"]] == [("failed", why, True)] * 2
    req = pd.read_parquet(d / "requests.parquet")
    assert req["request_index"].tolist() == list(range(N)) * 2
    assert set(req["error"]) == {f"not sent: {why}"}


@pytest.mark.slow
def test_a_server_that_dies_mid_run_stops_it_with_the_resume_line(tmp_path):
    with stub("good", die_after=N // 2) as server:  # in the first point's measured requests
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({
            "study": "dies", "executor": "local", "out": str(tmp_path / "res"),
            "engine": {"kind": "http", "targets": {"off": url}, "block_size": 16, "metrics_path": None,
                       "health_timeout_s": 1},
            "dataset": {"num_requests": N, "prefix_len": 32, "suffix_len": 4, "output_len": 4},
            # No engine warm-up: die_after counts the measured requests.
            "sweep": {"rates": [20, 40], "modes": ["off"], "num_requests": N, "warmup_requests": 0,
                      "prime_prefixes": False, "engine_warmup": {"max_batches": 0}}}))
        r = forkcli.run(["run", cfg, "--quiet", "--no-report"], cwd=REPO, timeout=180)
    (d,) = (tmp_path / "res" / "dies").iterdir()
    assert r.returncode == 1, r.stderr  # not 2: the input was fine, the server went away
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("error: cache OFF: the engine died and did not come back (")
    assert "not healthy after 1 s" in line
    assert line.endswith(f"; finished points are saved; continue with: prefixstudy run --resume {d}")
    m = json.loads((d / "manifest.json").read_text())
    assert m["status"] == "failed"
    assert [(p["rate"], p["status"], p["error"]) for p in m["points"]] == [(20.0, "failed", "engine died during the point")]


@pytest.mark.slow
def test_a_base_url_ending_in_v1_is_named_with_the_fix(tmp_path):
    with stub("good") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({
            "study": "v1", "executor": "local", "out": str(tmp_path / "res"),
            "engine": {"kind": "http", "targets": {"off": f"{url}/v1"}, "block_size": 16, "health_timeout_s": 1},
            "dataset": {"num_requests": N, "prefix_len": 32, "suffix_len": 4, "output_len": 4},
            "sweep": {"rates": [20], "modes": ["off"], "num_requests": N, "warmup_requests": 0}}))
        r = forkcli.run(["run", cfg, "--quiet", "--no-report"], cwd=REPO, timeout=180)
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1, r.stderr
    assert (f"{url}/v1 not healthy after 1 s (HTTP 404); the base URL is the server's root, without /v1: {url}"
            in r.stderr), r.stderr


@pytest.mark.slow
def test_the_report_renders_a_study_whose_points_all_failed(tmp_path):
    r, d = run_against(tmp_path, "http500")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"report: {d / 'report.html'}" in r.stdout.splitlines()
    md = (d / "report.md").read_text()
    assert "No point finished, so there is nothing to draw." in md
    assert md.count("6 of 6 requests failed: HTTP 500: Internal Server Error: out of cheese (6x)") >= 2  # ON, OFF


def test_caching_gain_draws_rates_without_a_gain():
    from prefixstudy.report import figures

    gains = pd.DataFrame({"rate": [20.0, 40.0], "metric": ["e2e_ms"] * 2, "gain": [None, 0.5],
                          "ci_lo": [None, 0.4], "ci_hi": [None, 0.6]})  # object columns: a TypeError before
    (line,) = [ln for ln in figures.caching_gain(gains).axes[0].lines if ln.get_label() == "mean E2E gain"]
    assert [round(v, 6) if v == v else "nan" for v in line.get_ydata()] == ["nan", 50.0]  # noqa: PLR0124 - NaN test
