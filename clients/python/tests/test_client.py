"""kvindex.Client and kvindex.AsyncClient against real kvindex daemons fed
by simulated vLLM engines over ZeroMQ (see rig.py). `make test-python`
installs the package with pip into a virtual environment and runs them
from the repository root with its interpreter:

    python -m unittest discover -s clients/python/tests -v
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import unittest
import uuid
from unittest import mock

import grpc

import kvindex
from kvindex.errors import parse_status_details

import rig
from rig import BLOCK, MODEL, ROOT, SLOW, wait_for

R: rig.Rig = None
PLAIN = SECURE = TIGHT = ""  # the daemons' addresses
CERTS: dict = {}
ROUTER_TOKEN, READER_TOKEN = "router-secret", "reader-secret"


def setUpModule():
    global R, PLAIN, SECURE, TIGHT, CERTS
    R = rig.Rig()
    try:
        pods = [e.pod_yaml() for e in R.engines]
        model = {"name": MODEL, "block_size": BLOCK, "tokenizer_urls": [e.url for e in R.engines]}
        slow = {"name": SLOW, "block_size": BLOCK, "tokenizer_urls": [R.stuck.url]}
        # Admission control's adaptive bound (a 1 ms queue target) would shed
        # the concurrent calls of these tests whenever the machine is busy:
        # shedding is tested on TIGHT, with a fixed bound.
        PLAIN = R.daemon("plain", {"models": [model, slow], "pods": pods,
                                   "limits": {"queue_target": "1s", "max_queue_delay": "10s"}})

        CERTS = R.certs()
        for name, secret in [("router", ROUTER_TOKEN), ("reader", READER_TOKEN)]:
            (R.dir / name).write_text(secret + "\n")
        SECURE = R.daemon("secure", {
            "models": [model],
            "pods": pods,
            "tls": {"cert_file": str(CERTS["server.pem"]), "key_file": str(CERTS["server.key"]),
                    "client_ca_file": str(CERTS["ca.pem"])},
            "auth": {"tokens": [
                {"name": "router", "scopes": ["read", "route"], "file": str(R.dir / "router")},
                {"name": "reader", "scopes": ["read"], "file": str(R.dir / "reader")},
            ]},
            "limits": {"max_inflight": 1},
        })
        # One Score or Route taken on at a time: the second is shed. The held
        # one waits on the stuck tokenizer until the test releases it, however
        # slow the machine.
        TIGHT = R.daemon("tight", {"models": [slow], "pods": [pods[0]], "limits": {"max_pending": 1},
                                   "tokenize": {"timeout": "20s"}})

        with kvindex.Client(PLAIN) as kv:
            def connected():
                ws = kv.workers(MODEL)
                return len(ws) == 2 and all(w.connected and w.health == "OK" for w in ws)
            wait_for(connected, 30, "both engines connected and OK on the plain daemon")
    except BaseException:
        R.stop()
        raise


def tearDownModule():
    R.stop()


def unique(what: str, paragraphs: int = 3) -> str:
    """A prompt no other test sends: paragraphs of 100 bytes (25 tokens of
    the stand-in tokenizer) each."""
    tag = uuid.uuid4().hex
    return "\n\n".join(f"{what} {tag} paragraph {i} ".ljust(100, "x") for i in range(paragraphs))


def holder(kv, **prompt):
    """The pod the index says holds prompt's first block (by its engine's
    events, not a speculative Route), None if none."""
    best = kv.score(MODEL, **prompt).best
    return best.worker.pod if best and best.matched_blocks > best.speculative_blocks else None


def secure_client(token=ROUTER_TOKEN, cert=True, **kw) -> kvindex.Client:
    tls = kvindex.TLS(
        ca=CERTS["ca.pem"],
        cert=CERTS["client.pem"] if cert else None,
        key=CERTS["client.key"] if cert else None,
        server_name="kvindex.test",
    )
    return kvindex.Client(SECURE, tls=tls, token=token, **kw)


class ScoreTest(unittest.TestCase):
    def setUp(self):
        self.kv = kvindex.Client(PLAIN, timeout=5)
        self.addCleanup(self.kv.close)

    def test_score_after_stored_events(self):
        e0 = R.engines[0]
        prompt = unique("score")
        tokens = e0.tokenize(prompt)
        full = len(tokens) // BLOCK
        self.assertGreaterEqual(full, 4)
        e0.complete(prompt)

        def cached():
            r = self.kv.score(MODEL, tokens=tokens)
            w = r.of(kvindex.Worker("engine-0"))
            return r if w and w.matched_blocks == full else None

        r = wait_for(cached, 10, "engine-0's events to reach the index")
        self.assertEqual(r.block_size, BLOCK)
        self.assertEqual(r.prompt_blocks, full)
        best = r.best
        self.assertEqual(best.worker, kvindex.Worker("engine-0", 0))
        self.assertEqual(best.matched_tokens, full * BLOCK)
        self.assertEqual(best.speculative_blocks, 0)
        self.assertEqual(best.by_medium, (kvindex.MediumMatch("GPU", full, full * BLOCK),))
        self.assertEqual(best.health, "OK")
        self.assertIsNone(r.of(kvindex.Worker("engine-1")))  # holds none of it

        # The same prompt as text, tokenized by the engine through kvindex.
        self.assertEqual(self.kv.score(MODEL, prompt=prompt).best.matched_blocks, full)
        # Candidates: every one named appears, engine-1 with nothing.
        r = self.kv.score(MODEL, tokens=tokens, workers=["engine-1", ("engine-0", 0)])
        self.assertEqual({w.worker.pod: w.matched_blocks for w in r.workers}, {"engine-0": full, "engine-1": 0})
        with self.assertRaises(dataclasses.FrozenInstanceError):
            r.workers[0].matched_blocks = 0

    def test_score_messages(self):
        e1 = R.engines[1]
        messages = [
            {"role": "system", "content": unique("system", 4)},
            {"role": "user", "content": [{"type": "text", "text": "Which tables?"}]},
        ]
        e1.chat(messages)
        wait_for(lambda: holder(self.kv, messages=messages) == "engine-1", 10, "engine-1's chat blocks")
        r = self.kv.score(MODEL, messages=messages)
        self.assertEqual(r.best.worker.pod, "engine-1")
        self.assertGreaterEqual(r.best.matched_blocks, 6)  # the system prompt's 100 tokens at least
        # (role, content) pairs are the same chat.
        r2 = self.kv.score(MODEL, messages=[(m["role"], m["content"]) for m in messages[:1]] + [("user", "Which tables?")])
        self.assertEqual(r2.best.matched_blocks, r.best.matched_blocks)

    def test_workers(self):
        ws = self.kv.workers()
        self.assertEqual([w.worker for w in ws], [kvindex.Worker("engine-0"), kvindex.Worker("engine-1")])
        for w, e in zip(ws, R.engines):
            self.assertEqual(w.model, MODEL)
            self.assertEqual(w.endpoint, f"tcp://127.0.0.1:{e.pub}")
            self.assertTrue(w.connected)
        self.assertEqual(self.kv.workers(SLOW), ())


class RouteTest(unittest.TestCase):
    def setUp(self):
        self.kv = kvindex.Client(PLAIN, timeout=5)
        self.addCleanup(self.kv.close)

    def test_route_then_release(self):
        prompt = unique("route")
        rid = "route-" + uuid.uuid4().hex
        r = self.kv.route(MODEL, rid, prompt=prompt)
        self.assertIn(r.chosen.pod, {"engine-0", "engine-1"})
        self.assertEqual(r.ranking.best.worker, r.chosen)
        self.assertEqual({w.worker.pod for w in r.ranking.workers}, {"engine-0", "engine-1"})
        blocks = r.ranking.prompt_blocks
        self.assertGreater(blocks, 0)

        # Until its events arrive, the prompt counts as cached on the
        # chosen worker, and its prefill as that worker's load.
        s = self.kv.score(MODEL, prompt=prompt)
        self.assertEqual(s.best.worker, r.chosen)
        self.assertEqual(s.best.speculative_blocks, blocks)
        inflight = {w.worker: w.inflight_requests for w in self.kv.workers(MODEL)}
        self.assertEqual(inflight[r.chosen], 1)

        self.assertTrue(self.kv.release(rid))
        self.assertFalse(self.kv.release(rid))  # already released
        inflight = {w.worker: w.inflight_requests for w in self.kv.workers(MODEL)}
        self.assertEqual(inflight[r.chosen], 0)

    def test_route_pick(self):
        rid = "pick-" + uuid.uuid4().hex
        r = self.kv.route(MODEL, rid, prompt=unique("pick"), pick=kvindex.Worker("engine-1"))
        self.addCleanup(self.kv.release, rid)
        self.assertEqual(r.chosen, kvindex.Worker("engine-1", 0))


class SecureTest(unittest.TestCase):
    """TLS with a client certificate, and bearer tokens with scopes."""

    def test_tls_and_token(self):
        with secure_client() as kv:
            self.assertEqual(len(kv.workers(MODEL)), 2)
            rid = "tls-" + uuid.uuid4().hex
            r = kv.route(MODEL, rid, prompt=unique("tls"))
            self.assertIn(r.chosen.pod, {"engine-0", "engine-1"})
            self.assertTrue(kv.release(rid))
        with secure_client(token=READER_TOKEN) as kv:
            self.assertGreater(kv.score(MODEL, prompt=unique("reader")).prompt_blocks, 0)

    def test_unauthenticated(self):
        for token in [None, "not-a-token"]:
            with secure_client(token=token) as kv, self.assertRaises(kvindex.Unauthenticated) as cm:
                kv.workers()
            self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(cm.exception.method, "ListWorkers")

    def test_permission_denied(self):
        with secure_client(token=READER_TOKEN) as kv, self.assertRaises(kvindex.PermissionDenied) as cm:
            kv.route(MODEL, "denied", prompt=unique("denied"))
        self.assertIn('needs "route"', cm.exception.message)

    def test_no_client_certificate(self):
        with secure_client(cert=False) as kv, self.assertRaises(kvindex.Unavailable):
            kv.workers()

    def test_resource_exhausted(self):
        # limits.max_inflight is 1: a second routed request is refused
        # until the first is released. A bound, not overload.
        with secure_client() as kv:
            first = "first-" + uuid.uuid4().hex
            kv.route(MODEL, first, prompt=unique("first"))
            try:
                with self.assertRaises(kvindex.ResourceExhausted) as cm:
                    kv.route(MODEL, "second", prompt=unique("second"))
            finally:
                self.assertTrue(kv.release(first))
            self.assertNotIsInstance(cm.exception, kvindex.Overloaded)
            self.assertEqual(cm.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)


class ErrorTest(unittest.TestCase):
    """Every error class from a real refusal."""

    def setUp(self):
        self.kv = kvindex.Client(PLAIN, timeout=5)
        self.addCleanup(self.kv.close)

    def test_invalid_argument_names_the_field(self):
        cases = [
            (dict(model="no/such-model", tokens=[1] * 32), "model", "unknown model"),
            (dict(model=""), "model", "required"),
            (dict(model=MODEL), "token_ids", "required"),
            (dict(model=MODEL, tokens=[1] * 32, prompt="both"), "token_ids, block_keys, prompt, messages", "exactly one"),
            (dict(model=MODEL, tokens=[1] * 32, workers=["ghost"]), "workers[0]", "unknown worker"),
            (dict(model=MODEL, messages=[("", "no role")]), "messages[0].role", "required"),
        ]
        for kw, field, text in cases:
            with self.subTest(kw=kw), self.assertRaises(kvindex.InvalidArgument) as cm:
                self.kv.score(**kw)
            self.assertEqual(cm.exception.field, field, cm.exception.message)
            self.assertIn(text, cm.exception.message)
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(kvindex.InvalidArgument) as cm:
            self.kv.route(MODEL, "", tokens=[1] * 32)
        self.assertEqual(cm.exception.field, "request_id")

    def test_deadline_exceeded(self):
        # The model's tokenizer hangs: the call's own deadline ends it.
        R.stuck.hold(self)
        before = R.stuck.arrived
        with self.assertRaises(kvindex.DeadlineExceeded) as cm:
            self.kv.score(SLOW, prompt=unique("deadline"), timeout=0.3)
        self.assertEqual(cm.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        # Its tokenization reached the tokenizer (no later test counts it).
        R.stuck.wait_arrived(before + 1)

    def test_unavailable(self):
        with kvindex.Client(f"127.0.0.1:{rig.free_port()}", timeout=2) as kv, \
                self.assertRaises(kvindex.Unavailable) as cm:
            kv.score(MODEL, tokens=[1] * 32)
        self.assertEqual(cm.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_overloaded(self):
        # limits.max_pending is 1 on the tight daemon: while one Score waits
        # on the stuck tokenizer, the next is shed.
        R.stuck.hold(self)
        before = R.stuck.arrived
        held: list = []
        with kvindex.Client(TIGHT, timeout=10) as kv:
            t = threading.Thread(target=lambda: held.append(self._score_err(kv, unique("held"))))
            t.start()
            try:
                R.stuck.wait_arrived(before + 1)
                with self.assertRaises(kvindex.Overloaded) as cm:
                    kv.score(SLOW, prompt=unique("shed"))
            finally:
                R.stuck.released.set()
                t.join(15)
        e = cm.exception
        self.assertEqual(e.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("already pending", e.message)
        self.assertIsNone(e.retry_after)  # kvindex sends no RetryInfo
        self.assertIsInstance(e, kvindex.KvindexError)
        self.assertNotIsInstance(e, kvindex.ResourceExhausted)
        self.assertEqual(len(held), 1)
        self.assertIsInstance(held[0], kvindex.Unavailable)  # the tokenizer answered 503

    @staticmethod
    def _score_err(kv, prompt):
        try:
            kv.score(SLOW, prompt=prompt)
        except kvindex.KvindexError as e:
            return e
        return None

    def test_status_details(self):
        # google.rpc.Status{code 8, details [ErrorInfo{OVERLOADED,
        # kvindex.io}, RetryInfo{1.5 s}]}, encoded by hand.
        def ld(num, b):
            return bytes([num << 3 | 2, len(b)]) + b

        def anyof(url, body):
            return ld(1, url.encode()) + ld(2, body)

        info = anyof("type.googleapis.com/google.rpc.ErrorInfo", ld(1, b"OVERLOADED") + ld(2, b"kvindex.io"))
        retry = anyof("type.googleapis.com/google.rpc.RetryInfo", ld(1, bytes([0x08, 1, 0x10]) + _varint(500_000_000)))
        status = bytes([0x08, 8]) + ld(2, b"overloaded") + ld(3, info) + ld(3, retry)
        d = parse_status_details(status)
        self.assertTrue(d.overloaded)
        self.assertEqual(d.retry_after, 1.5)

        other = anyof("type.googleapis.com/google.rpc.ErrorInfo", ld(1, b"OVERLOADED") + ld(2, b"example.com"))
        self.assertFalse(parse_status_details(bytes([0x08, 8]) + ld(3, other)).overloaded)
        with self.assertRaises(ValueError):
            parse_status_details(bytes([0x1A, 40, 1]))  # a detail longer than the message


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class ClientTest(unittest.TestCase):
    def test_timeout_must_be_positive(self):
        with self.assertRaises(ValueError):
            kvindex.Client(PLAIN, timeout=0)

    def test_tls_cert_needs_key(self):
        with self.assertRaises(ValueError):
            kvindex.Client(SECURE, tls=kvindex.TLS(ca=CERTS["ca.pem"], cert=CERTS["client.pem"]))

    def test_closed_client_fails(self):
        kv = kvindex.Client(PLAIN)
        kv.close()
        with self.assertRaises(ValueError):  # grpc's "closed channel"
            kv.workers()

    def test_one_channel_retries_off(self):
        with mock.patch("grpc.insecure_channel", wraps=grpc.insecure_channel) as made:
            with kvindex.Client(PLAIN, timeout=5) as kv:
                for _ in range(5):
                    kv.workers(MODEL)
                    kv.score(MODEL, tokens=[1] * 32)
        self.assertEqual(made.call_count, 1)
        self.assertIn(("grpc.enable_retries", 0), made.call_args.kwargs["options"])
        with mock.patch("grpc.insecure_channel", wraps=grpc.insecure_channel) as made:
            kvindex.Client(PLAIN, options=[("grpc.enable_retries", 1)]).close()
        self.assertEqual([v for k, v in made.call_args.kwargs["options"] if k == "grpc.enable_retries"], [1])


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    """kvindex.AsyncClient: Client's calls, results, errors and deadlines
    on asyncio, against the same daemons."""

    async def asyncSetUp(self):
        self.kv = kvindex.AsyncClient(PLAIN, timeout=5)

    async def asyncTearDown(self):
        await self.kv.close()

    async def test_score_route_release_workers(self):
        e0 = R.engines[0]
        prompt = unique("aio")
        e0.complete(prompt)
        with kvindex.Client(PLAIN, timeout=5) as sync:
            wait_for(lambda: holder(sync, prompt=prompt) == "engine-0", 10, "engine-0 to hold the prompt")
            want = sync.score(MODEL, prompt=prompt)
        got = await self.kv.score(MODEL, prompt=prompt)
        self.assertEqual(got, want)  # the same frozen values as Client's
        self.assertEqual(got.best.worker, kvindex.Worker("engine-0"))
        self.assertEqual(got.best.matched_blocks, len(e0.tokenize(prompt)) // BLOCK)

        rid = f"aio-{uuid.uuid4().hex}"
        r = await self.kv.route(MODEL, rid, prompt=prompt, workers=["engine-1"])
        self.assertEqual(r.chosen, kvindex.Worker("engine-1"))
        ws = {w.worker.pod: w for w in await self.kv.workers(MODEL)}
        self.assertEqual(ws["engine-1"].inflight_requests, 1)
        self.assertTrue(await self.kv.release(rid))
        self.assertFalse(await self.kv.release(rid))
        self.assertEqual(sum(w.inflight_requests for w in await self.kv.workers(MODEL)), 0)

    async def test_errors(self):
        with self.assertRaises(kvindex.InvalidArgument) as cm:
            await self.kv.score("", tokens=[1] * 32)
        self.assertEqual(cm.exception.field, "model")
        async with kvindex.AsyncClient(f"127.0.0.1:{rig.free_port()}", timeout=2) as kv:
            with self.assertRaises(kvindex.Unavailable):
                await kv.score(MODEL, tokens=[1] * 32)
        tls = kvindex.TLS(ca=CERTS["ca.pem"], cert=CERTS["client.pem"], key=CERTS["client.key"], server_name="kvindex.test")
        async with kvindex.AsyncClient(SECURE, tls=tls, token=READER_TOKEN, timeout=5) as kv:
            self.assertEqual(len(await kv.workers(MODEL)), 2)
            with self.assertRaises(kvindex.PermissionDenied):
                await kv.route(MODEL, "aio-denied", tokens=[1] * 32)
        async with kvindex.AsyncClient(SECURE, tls=tls, token="wrong", timeout=5) as kv:
            with self.assertRaises(kvindex.Unauthenticated):
                await kv.workers()
        with self.assertRaises(ValueError):
            kvindex.AsyncClient(PLAIN, timeout=-1)

    async def test_deadline_does_not_block_the_loop(self):
        # The stuck tokenizer holds the call until its deadline; meanwhile
        # the event loop keeps running other tasks.
        R.stuck.hold(self)
        before = R.stuck.arrived
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        start = time.monotonic()
        with self.assertRaises(kvindex.DeadlineExceeded) as cm:
            await self.kv.score(SLOW, prompt=unique("aio-deadline"), timeout=0.5)
        took = time.monotonic() - start
        ticker.cancel()
        self.assertEqual(cm.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertGreaterEqual(took, 0.45)
        self.assertGreater(ticks, 10, "the event loop stalled while the call waited")
        # Its tokenization reached the tokenizer (no later test counts it).
        R.stuck.wait_arrived(before + 1)

    async def test_overloaded(self):
        R.stuck.hold(self)
        before = R.stuck.arrived
        async with kvindex.AsyncClient(TIGHT, timeout=10) as kv:
            held = asyncio.create_task(kv.score(SLOW, prompt=unique("aio-held")))
            await asyncio.get_running_loop().run_in_executor(None, R.stuck.wait_arrived, before + 1)
            with self.assertRaises(kvindex.Overloaded) as cm:
                await kv.score(SLOW, prompt=unique("aio-shed"))
            R.stuck.released.set()
            with self.assertRaises(kvindex.Unavailable):  # the tokenizer answered 503
                await held
        self.assertIn("already pending", cm.exception.message)

    async def test_one_channel_retries_off(self):
        with mock.patch("grpc.aio.insecure_channel", wraps=grpc.aio.insecure_channel) as made:
            async with kvindex.AsyncClient(PLAIN, timeout=5) as kv:
                await asyncio.gather(*(kv.score(MODEL, tokens=[1] * 32) for _ in range(10)))
        self.assertEqual(made.call_count, 1)
        self.assertIn(("grpc.enable_retries", 0), made.call_args.kwargs["options"])


def load_router():
    spec = importlib.util.spec_from_file_location("router", ROOT / "clients/python/examples/router.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class RouterExampleTest(unittest.IsolatedAsyncioTestCase):
    """examples/router.py: kvindex's choice when it answers, round robin
    when it cannot, on asyncio."""

    engines = {"engine-0": "http://engine-0:8000", "engine-1": "http://engine-1:8000"}

    async def test_routes_to_the_cached_engine(self):
        router_mod = load_router()
        e0, e1 = R.engines
        prompt = unique("router")
        messages = [{"role": "system", "content": unique("router-chat", 4)}, {"role": "user", "content": "hi"}]
        e0.complete(prompt)
        e1.chat(messages)
        with kvindex.Client(PLAIN, timeout=5) as kv:
            wait_for(lambda: holder(kv, prompt=prompt) == "engine-0", 10, "engine-0 to hold the prompt")
            wait_for(lambda: holder(kv, messages=messages) == "engine-1", 10, "engine-1 to hold the chat")
        async with kvindex.AsyncClient(PLAIN, timeout=5) as kv:
            router = router_mod.KvindexRouter(kv, MODEL, self.engines)
            for i in range(3):  # the cached engine every time, in flight or not
                rid = f"router-{uuid.uuid4().hex}"
                self.assertEqual(await router.route_request({"model": MODEL, "prompt": prompt}, rid), "http://engine-0:8000")
                await router.on_request_done(rid)
            rid = f"router-{uuid.uuid4().hex}"
            self.assertEqual(await router.route_request({"model": MODEL, "messages": messages}, rid), "http://engine-1:8000")
            await router.on_request_done(rid)
            self.assertEqual(router.fallbacks, 0)
            self.assertEqual(sum(w.inflight_requests for w in await kv.workers(MODEL)), 0)

    async def test_round_robin_without_kvindex(self):
        router_mod = load_router()
        async with kvindex.AsyncClient(f"127.0.0.1:{rig.free_port()}", timeout=1) as kv:
            router = router_mod.KvindexRouter(kv, MODEL, self.engines)
            with self.assertLogs("router", "WARNING") as logs:
                got = [await router.route_request({"prompt": "x"}, f"rr-{i}") for i in range(4)]
                await router.on_request_done("rr-0")  # logged, not raised
        self.assertEqual(len(logs.records), 5)
        self.assertIn("UNAVAILABLE", logs.output[0])
        self.assertEqual(got, ["http://engine-0:8000", "http://engine-1:8000"] * 2)
        self.assertEqual(router.fallbacks, 4)


class ReadmeTest(unittest.TestCase):
    def test_python_snippet_runs(self):
        readme = (ROOT / "README.md").read_text()
        section = readme.split("\n### Python\n", 1)
        self.assertEqual(len(section), 2, "README.md has no '### Python' section")
        m = re.search(r"```sh\n(.*?)```", section[1], re.S)
        self.assertIsNotNone(m, "the Python section has no sh block")
        cmd = m.group(1).replace("localhost:50051", PLAIN)
        self.assertIn(PLAIN, cmd, "the snippet no longer dials localhost:50051")
        # python3 is the interpreter running these tests, kvindex installed in it.
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        out = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"engine-[01]")


if __name__ == "__main__":
    unittest.main()
