"""The tests' rig: real processes on loopback. The kvindex daemon and the
simulated vLLM engine (kvsim engine: vLLM's ZeroMQ KV events, /tokenize,
the render endpoints, /v1/completions) are built once with `go build`, and
a tokenizer that never answers until told stands in for a stuck vLLM
server. Everything is started on free ports and stopped by its own handle.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SLOW = "stuck/tokenizer"  # a model whose only tokenizer never answers in time
BLOCK = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, what: str):
    """Polls cond until it returns a true value, which it returns; fails
    naming what after timeout seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


def post_json(url: str, body: dict, timeout: float = 10) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


class Proc:
    """A child process logging to a file of the rig's directory."""

    def __init__(self, name: str, argv: list, rig: "Rig"):
        self.name = name
        self.log = rig.dir / f"{name}.log"
        with open(self.log, "wb") as f:
            self.p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class Engine:
    """One kvsim engine: pod name, HTTP base URL, event and replay ports."""

    def __init__(self, rig: "Rig", pod: str):
        self.pod = pod
        self.http, self.pub, self.replay = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.proc = Proc(
            pod,
            [
                str(rig.bin / "kvsim"), "engine", "--model", MODEL, "--pod", pod,
                "--http", f"127.0.0.1:{self.http}",
                "--publish", f"tcp://127.0.0.1:{self.pub}",
                "--replay", f"tcp://127.0.0.1:{self.replay}",
                "--block-size", str(BLOCK), "--prefill-rate", "1e7",
            ],
            rig,
        )
        rig.procs.append(self.proc)

    def ready(self):
        with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
            return r.status == 200

    def tokenize(self, prompt: str) -> list:
        return post_json(self.url + "/tokenize", {"model": MODEL, "prompt": prompt})["tokens"]

    def complete(self, prompt: str):
        """Serves a completion: the engine caches the prompt's full blocks
        and announces them."""
        post_json(self.url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})

    def chat(self, messages: list):
        post_json(self.url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})

    def pod_yaml(self) -> dict:
        return {
            "name": self.pod,
            "model": MODEL,
            "endpoint": f"tcp://127.0.0.1:{self.pub}",
            "replay_endpoint": f"tcp://127.0.0.1:{self.replay}",
        }


class StuckTokenizer:
    """An HTTP server that takes every request and answers 503 only when
    released (or after 30 s): a vLLM tokenizer that hangs. .arrived counts
    the requests it holds or held."""

    def __init__(self):
        self.released = threading.Event()
        self.cond = threading.Condition()
        self.arrived = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.cond:
                    outer.arrived += 1
                    outer.cond.notify_all()
                outer.released.wait(30)
                try:
                    self.send_response(503)
                    self.end_headers()
                except OSError:  # kvindex gave up first
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold(self, test):
        """Makes requests hang until test ends (or release is set)."""
        self.released.clear()
        test.addCleanup(self.released.set)

    def wait_arrived(self, n: int, timeout: float = 10):
        with self.cond:
            if not self.cond.wait_for(lambda: self.arrived >= n, timeout):
                raise AssertionError(f"the stuck tokenizer got {self.arrived} requests, want {n}")

    def stop(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


class Rig:
    """The binaries, two engines, the stuck tokenizer and the daemons the
    tests start (stop() ends them all)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="kvindex-py-"))
        self.bin = self.dir / "bin"
        self.procs: list = []
        self.stuck = None
        go = os.environ.get("GO", "go")
        subprocess.run(
            [go, "build", "-o", str(self.bin) + "/", "./cmd/kvindex", "./testbed/cmd/kvsim"],
            cwd=ROOT, check=True,
        )
        self.engines = [Engine(self, "engine-0"), Engine(self, "engine-1")]
        self.stuck = StuckTokenizer()
        for e in self.engines:
            wait_for(e.ready, 30, f"{e.pod}'s /health (log: {e.proc.log})")

    def daemon(self, name: str, cfg: dict) -> str:
        """Starts kvindex serve with cfg (plus a free grpc_listen, metrics
        off) and returns its address once it answers."""
        addr = f"127.0.0.1:{free_port()}"
        cfg = dict(cfg, grpc_listen=addr, metrics_listen="off")
        path = self.dir / f"{name}.yaml"
        path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
        p = Proc(name, [str(self.bin / "kvindex"), "serve", "--config", str(path)], self)
        self.procs.append(p)

        def listening():
            if p.p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.p.returncode}:\n{p.tail()}")
            with socket.create_connection(addr.split(":"), timeout=1):
                return True

        wait_for(listening, 30, f"{name} to listen on {addr}")
        return addr

    def certs(self) -> dict:
        """A CA, a server certificate for the name kvindex.test only, and a
        client certificate, made with the openssl CLI."""
        d = self.dir / "tls"
        d.mkdir()
        ossl = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=kvindex test CA")
        for name, ext in [
            ("server", "subjectAltName=DNS:kvindex.test\nextendedKeyUsage=serverAuth\n"),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ]:
            (d / f"{name}.ext").write_text(ext)
            ossl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
            ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
        return {k: d / f"{k}" for k in ["ca.pem", "server.pem", "server.key", "client.pem", "client.key"]}

    def stop(self):
        for p in reversed(self.procs):
            p.stop()
        if self.stuck:
            self.stuck.stop()
        if os.environ.get("KVINDEX_KEEP_LOGS"):
            print(f"logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
