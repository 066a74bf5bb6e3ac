"""The LLM proposer against a local stand-in for a chat-completions endpoint: what it sends, that its
kernels go through the same gauntlet (a wrong one is rejected and the rejection is fed back), and
that an endpoint that is down only costs a log line."""
import json
import os
import pathlib
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import CLI, KERNELS

HONEST = (KERNELS / "relu_cpu.cpp").read_text().replace("kc_relu_f32", "kc_llm_relu")
WRONG = HONEST.replace("? v : 0.0f", "? v : 0.01f * v")   # leaky relu: wrong for negative inputs
LAUNCH = json.loads((KERNELS / "relu_cpu.json").read_text().replace("kc_relu_f32", "kc_llm_relu"))


class FakeLlm:
    """Answers the n-th request with replies[n] (a kernel as a fenced JSON object), then HTTP 500,
    in the response format of `api` (OpenAI chat completions or Anthropic messages)."""

    def __init__(self, replies, api="openai"):
        self.replies = replies
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"auth": self.headers.get("Authorization"), "x-api-key": self.headers.get("x-api-key"),
                                       "version": self.headers.get("anthropic-version"), "body": body})
                n = len(outer.requests) - 1
                if n >= len(outer.replies):
                    self.send_response(500)
                    self.end_headers()
                    return
                content = "```json\n" + json.dumps(outer.replies[n]) + "\n```"
                if api == "anthropic":
                    reply = {"type": "message", "content": [{"type": "text", "text": content}]}
                else:
                    reply = {"choices": [{"message": {"role": "assistant", "content": content}}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def evolve(cache, url, *extra, json_out=True, api="openai"):
    env = dict(os.environ, KERNELCRAFT_LLM_URL=url, KERNELCRAFT_LLM_API=api, KERNELCRAFT_LLM_MODEL="test-model",
               KERNELCRAFT_LLM_KEY="secret-token-123", KERNELCRAFT_EVOLVE_LAMBDA="2",
               KERNELCRAFT_EVOLVE_GENERATIONS="3")
    args = [CLI, "--cache-dir", str(cache)] + (["--json"] if json_out else []) + \
        ["evolve", "--backend", "cpu", "--op", "relu", "--shape", "300x7", *extra]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_llm_kernels_are_asked_for_verified_and_fed_back(tmp_path, api):
    llm = FakeLlm([{"source": WRONG, "launch": LAUNCH}, {"source": HONEST, "launch": LAUNCH}], api=api)
    try:
        r = evolve(tmp_path / "cache", llm.url, api=api)
    finally:
        llm.close()
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)[0]
    assert result["outcome"] in ("served", "eager_best"), result
    assert len(llm.requests) >= 2, "one request per generation"
    first = llm.requests[0]
    assert first["body"]["model"] == "test-model"
    if api == "anthropic":
        assert first["x-api-key"] == "secret-token-123" and first["version"] and first["auth"] is None
        assert "kc_cpu_ctx" in first["body"]["system"]
    else:
        assert first["auth"] == "Bearer secret-token-123"
    task = first["body"]["messages"][-1]["content"]
    assert "aten::relu" in task and "[300,7]" in task
    assert "fastest verified kernel" in task, "generation 0's best template kernel is shown"
    second = llm.requests[1]["body"]["messages"][-1]["content"]
    assert "was rejected" in second and "numerics" in second, second[-600:]

    s = subprocess.run([CLI, "--cache-dir", str(tmp_path / "cache"), "--json", "search-state", result["key"]],
                       capture_output=True, text=True)
    assert s.returncode == 0, s.stderr
    tried = [e for e in json.loads(s.stdout)["tried"] if e["origin"] == "llm"]
    assert [e["verdict"] for e in tried[:2]] == ["rejected", "passed"], tried
    assert tried[0]["stage"] == "numerics"
    # The key is read from the environment for each request and never stored.
    for f in (tmp_path / "cache").rglob("*"):
        if f.is_file():
            assert b"secret-token-123" not in f.read_bytes(), f


def test_an_endpoint_that_is_down_costs_a_log_line(tmp_path):
    r = evolve(tmp_path / "cache", "http://127.0.0.1:9/v1/chat/completions", json_out=False)
    assert r.returncode == 0, r.stderr
    assert "llm proposer:" in r.stderr and "failed" in r.stderr, r.stderr[-2000:]
    assert "served" in r.stdout or "eager_best" in r.stdout, r.stdout
