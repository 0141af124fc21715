"""Client: kvindex's gRPC API for Python routers."""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional, Sequence, Union

import grpc

from kvindex import errors
from kvindex.v1 import index_pb2 as pb
from kvindex.v1 import index_pb2_grpc as pb_grpc
from kvindex.values import (
    TLS,
    RouteResult,
    ScoreResult,
    Worker,
    WorkerStatus,
    route_result,
    score_result,
    worker_status,
)

__all__ = ["Client"]

# A worker as a caller may name it: a Worker, a pod name (rank 0), or a
# (pod, dp_rank) pair.
WorkerLike = Union[Worker, str, Sequence]
# A chat message as in an OpenAI /v1/chat/completions body: a mapping with
# "role" and "content" (a string, or a list of parts whose text parts are
# joined by newlines), or a (role, content) pair.
MessageLike = Union[Mapping, Sequence]


class Client:
    """A client of one kvindex server (a host:port or any gRPC target).

    It holds one channel for its life, shared by every call and safe to use
    from many threads. Every call has a deadline (timeout seconds, the
    call's own or the client's default), gRPC's retries are off (a router
    decides itself what a failure means: see kvindex.errors; options, gRPC
    channel arguments, may turn them on), and every failure raises a
    kvindex.errors.KvindexError subclass. The client keeps no global state:
    two clients of two servers are independent. kvindex.AsyncClient is the
    same on asyncio.

    tls=None speaks plaintext; a kvindex.TLS turns on TLS (with a client
    certificate for mTLS when it has one). token, when set, is sent as
    "authorization: Bearer <token>" on every call.
    """

    def __init__(
        self,
        target: str,
        tls: Optional[TLS] = None,
        token: Optional[str] = None,
        timeout: float = 1.0,
        options: Iterable = (),
    ):
        _check_timeout(timeout)
        self.target = target
        self.timeout = timeout
        self._metadata = _metadata(token)
        self._channel = _open_channel(grpc, target, tls, options)
        self._stub = pb_grpc.IndexServiceStub(self._channel)

    def score(
        self,
        model: str,
        tokens: Optional[Sequence[int]] = None,
        prompt: Optional[str] = None,
        messages: Optional[Sequence[MessageLike]] = None,
        workers: Optional[Iterable[WorkerLike]] = None,
        timeout: Optional[float] = None,
        *,
        lora_name: str = "",
        cache_salt: str = "",
        tenant: str = "",
        explain: bool = False,
    ) -> ScoreResult:
        """Ranks the workers of model for one prompt, given one way: tokens
        (token ids after the chat template), prompt (text, tokenized by the
        model's vLLM server as /v1/completions would) or messages (a chat,
        rendered and tokenized as /v1/chat/completions would). workers, when
        given, restricts the answer to these candidates, each of which then
        appears in it."""
        req = _score_request(model, tokens, prompt, messages, workers, lora_name, cache_salt, tenant, explain)
        return score_result(self._call("Score", self._stub.Score, req, timeout))

    def route(
        self,
        model: str,
        request_id: str,
        tokens: Optional[Sequence[int]] = None,
        prompt: Optional[str] = None,
        messages: Optional[Sequence[MessageLike]] = None,
        workers: Optional[Iterable[WorkerLike]] = None,
        timeout: Optional[float] = None,
        *,
        pick: Optional[WorkerLike] = None,
        lora_name: str = "",
        cache_salt: str = "",
        tenant: str = "",
    ) -> RouteResult:
        """Ranks the workers like score, chooses one (the best, or pick)
        and records the choice under request_id: the prompt's blocks count
        as cached there until its engine's events confirm them, and its
        uncached prefill as that worker's load until release(request_id)."""
        req = _route_request(model, request_id, tokens, prompt, messages, workers, pick, lora_name, cache_salt, tenant)
        return route_result(self._call("Route", self._stub.Route, req, timeout))

    def release(self, request_id: str, timeout: Optional[float] = None) -> bool:
        """Ends a routed request's in-flight accounting (call it when its
        prefill is done or it failed). False when the id was unknown or
        had already expired."""
        req = pb.ReleaseRequest(request_id=request_id)
        return self._call("Release", self._stub.Release, req, timeout).released

    def workers(self, model: Optional[str] = None, timeout: Optional[float] = None) -> tuple[WorkerStatus, ...]:
        """Lists every worker (of model, when given) with its health,
        sorted by pod, then rank."""
        req = pb.ListWorkersRequest(model=model or "")
        return tuple(worker_status(w) for w in self._call("ListWorkers", self._stub.ListWorkers, req, timeout).workers)

    def close(self) -> None:
        """Closes the channel; calls in flight fail with Unavailable or are
        cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kvindex.Client({self.target!r})"

    def _call(self, method: str, rpc, req, timeout: Optional[float]):
        t = self.timeout if timeout is None else timeout
        try:
            return rpc(req, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, method, self.target) from None


def _check_timeout(timeout: float) -> None:
    if timeout <= 0:
        raise ValueError(f"kvindex: timeout {timeout!r}: must be positive")


def _metadata(token: Optional[str]):
    return (("authorization", "Bearer " + token),) if token else None


def _open_channel(module, target: str, tls: Optional[TLS], options: Iterable):
    """The client's one channel to target, made by module (grpc, or
    grpc.aio for AsyncClient: both have insecure_channel and
    secure_channel), plaintext or over tls."""
    creds, opts = _channel_args(tls, options)
    if creds is None:
        return module.insecure_channel(target, options=opts)
    return module.secure_channel(target, creds, options=opts)


def _channel_args(tls: Optional[TLS], options: Iterable):
    """The channel's credentials (None: plaintext) and options: gRPC's
    retries off unless options turn them on (a router decides itself what
    a failure means), then the caller's options, which win."""
    opts = [("grpc.enable_retries", 0)]
    mine = dict(options)
    if tls is None:
        return None, _merge(opts, mine)
    if (tls.cert is None) != (tls.key is None):
        raise ValueError("kvindex: TLS cert and key: give both (mTLS) or neither")
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    creds = grpc.ssl_channel_credentials(
        root_certificates=_pem(tls.ca), private_key=_pem(tls.key), certificate_chain=_pem(tls.cert)
    )
    return creds, _merge(opts, mine)


def _merge(defaults: list, mine: dict) -> list:
    return [(k, v) for k, v in defaults if k not in mine] + list(mine.items())


def _route_request(model, request_id, tokens, prompt, messages, workers, pick, lora_name, cache_salt, tenant):
    req = pb.RouteRequest(
        score=_score_request(model, tokens, prompt, messages, workers, lora_name, cache_salt, tenant, False),
        request_id=request_id,
    )
    if pick is not None:
        req.pick.CopyFrom(_worker_ref(pick))
    return req


def _score_request(model, tokens, prompt, messages, workers, lora_name, cache_salt, tenant, explain) -> pb.ScoreRequest:
    req = pb.ScoreRequest(
        model=model,
        token_ids=tokens or (),
        prompt=prompt or "",
        lora_name=lora_name,
        cache_salt=cache_salt,
        tenant=tenant,
        explain=explain,
    )
    for m in messages or ():
        req.messages.add(**_message(m))
    for w in workers or ():
        req.workers.append(_worker_ref(w))
    return req


def _message(m: MessageLike) -> dict:
    if isinstance(m, Mapping):
        role, content = m.get("role", ""), m.get("content", "")
    else:
        role, content = m
    if content is None:
        content = ""
    elif not isinstance(content, str):  # OpenAI content parts: keep the text
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return {"role": role, "content": content}


def _worker_ref(w: WorkerLike) -> pb.WorkerRef:
    if isinstance(w, Worker):
        return pb.WorkerRef(pod=w.pod, dp_rank=w.dp_rank)
    if isinstance(w, str):
        return pb.WorkerRef(pod=w)
    pod, rank = w
    return pb.WorkerRef(pod=pod, dp_rank=rank)


def _pem(v) -> Optional[bytes]:
    if v is None or isinstance(v, bytes):
        return v
    with open(os.fspath(v), "rb") as f:
        return f.read()
