"""SGLangServers, the data path of `lilicorr regenerate`, against stand-in /generate servers."""

import asyncio
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_lilicorr.train.engine import EngineError, Sampling, SGLangServers, ServerSpec

EOS = 2
# Answers /health and /generate in SGLang's shape: output_ids = the prompt's last id + 1, three
# times, then EOS (when max_new_tokens allows); the request body goes to stdout as one JSON line.
SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        print(json.dumps(body), flush=True)
        p = body["sampling_params"]
        ids = ([body["input_ids"][-1] + 1] * 3 + [2])[: p["max_new_tokens"]]
        data = json.dumps({"text": "x", "output_ids": ids, "meta_info": {}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def generate(servers, prompts, sampling, seeds):
    """The completions of several requests sent at once through one session."""

    async def run():
        async with servers.session() as complete:
            return await asyncio.gather(*(complete(p, sampling, s) for p, s in zip(prompts, seeds)))

    return asyncio.run(run())


def free_ports(n):
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


@pytest.fixture()
def flaky_server():
    """An in-process /generate server whose first request fails with HTTP 500."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if len(seen) == 1:
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps({"output_ids": [7, 8, EOS]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def test_requests_carry_ids_params_and_seeds_and_a_failure_is_retried(flaky_server):
    url, seen = flaky_server
    servers = SGLangServers([url], concurrency=2)
    out = generate(servers, [[1, 2], [3]], Sampling(1.0, 16, (EOS,)), seeds=[11, 12])
    assert [o.output_ids for o in out] == [[7, 8, EOS]] * 2 and all(o.finish_reason == "stop" for o in out)
    bodies = sorted(seen[1:], key=lambda b: b["input_ids"])
    assert [b["input_ids"] for b in bodies] == [[1, 2], [3]]
    params = bodies[0]["sampling_params"]
    assert params["temperature"] == 1.0 and params["stop_token_ids"] == [EOS] and params["sampling_seed"] in (11, 12)
    assert params["top_p"] == 1.0 and params["top_k"] == -1  # the untruncated distribution
    greedy = generate(servers, [[5]], Sampling(0.0, 16, (EOS,)), seeds=[0])
    assert "sampling_seed" not in seen[-1]["sampling_params"] and greedy[0].output_ids[-1] == EOS


def test_started_servers_spread_requests_and_stop(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    ports = free_ports(2)
    specs = [ServerSpec("model", port, str(i), ("--flag", str(i)), name=f"s{i}") for i, port in enumerate(ports)]
    with SGLangServers.start(
        specs, tmp_path / "logs", startup_timeout=60, launcher=[sys.executable, str(script)], warm_first=True
    ) as servers:
        assert servers.capacity == 2 * 256
        out = generate(servers, [[10], [20], [30], [40]], Sampling(0.0, 3, (EOS,)), seeds=[0] * 4)
        processes = list(servers.processes)
    assert [o.output_ids for o in out] == [[11, 11, 11], [21, 21, 21], [31, 31, 31], [41, 41, 41]]
    assert all(o.finish_reason == "length" for o in out)
    assert all(p.poll() is not None for p in processes)  # stopped on exit
    logs = {i: (tmp_path / "logs" / f"server-s{i}.log").read_text() for i in range(2)}
    assert all(logs[i].count("input_ids") == 2 for i in range(2))  # round robin


def test_a_server_that_dies_at_start_up_is_named(tmp_path):
    (tmp_path / "dead.py").write_text("import sys; sys.exit(3)")
    spec = ServerSpec("model", free_ports(1)[0], "0")
    with pytest.raises(EngineError, match="exited during start-up"):
        SGLangServers.start([spec], tmp_path, startup_timeout=30, launcher=[sys.executable, str(tmp_path / "dead.py")])


@pytest.mark.parametrize("visible, gpus, expected", [(None, 2, ["0", "1"]), ("1", 1, ["1"]), ("2,3", 2, ["2", "3"])])
def test_launch_puts_one_server_on_each_visible_gpu(monkeypatch, visible, gpus, expected):
    """Server i runs on the i-th GPU this process may use (CUDA_VISIBLE_DEVICES), not on physical GPU i."""
    seen = []
    monkeypatch.setattr(SGLangServers, "start", classmethod(lambda cls, specs, *a, **k: seen.extend(specs)))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    SGLangServers.launch("/m", gpus)
    assert [s.gpus for s in seen] == expected
