"""AsyncClient: kvindex.Client's calls on asyncio (grpc.aio), for routers
whose event loop must never wait on a blocking call."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import grpc
import grpc.aio

from kvindex import errors
from kvindex.client import (
    MessageLike,
    WorkerLike,
    _check_timeout,
    _metadata,
    _open_channel,
    _route_request,
    _score_request,
)
from kvindex.v1 import index_pb2 as pb
from kvindex.v1 import index_pb2_grpc as pb_grpc
from kvindex.values import TLS, RouteResult, ScoreResult, WorkerStatus, route_result, score_result, worker_status

__all__ = ["AsyncClient"]


class AsyncClient:
    """A client of one kvindex server on asyncio: kvindex.Client's methods,
    arguments, results, errors and deadlines, each a coroutine.

    It holds one grpc.aio channel for its life, shared by every call of the
    event loop it was made in (make it inside that loop, in a coroutine or
    a startup hook). Every call has a deadline (timeout seconds, the call's
    own or the client's default) and gRPC's retries are off unless options
    turn them on; every failure raises a kvindex.errors.KvindexError
    subclass, a cancelled call asyncio.CancelledError.

        async with kvindex.AsyncClient("localhost:50051") as kv:
            r = await kv.route(model, "req-1", prompt=text)
            ...
            await kv.release("req-1")
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
        self._channel = _open_channel(grpc.aio, target, tls, options)
        self._stub = pb_grpc.IndexServiceStub(self._channel)

    async def score(
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
        """kvindex.Client.score on asyncio."""
        req = _score_request(model, tokens, prompt, messages, workers, lora_name, cache_salt, tenant, explain)
        return score_result(await self._call("Score", self._stub.Score, req, timeout))

    async def route(
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
        """kvindex.Client.route on asyncio."""
        req = _route_request(model, request_id, tokens, prompt, messages, workers, pick, lora_name, cache_salt, tenant)
        return route_result(await self._call("Route", self._stub.Route, req, timeout))

    async def release(self, request_id: str, timeout: Optional[float] = None) -> bool:
        """kvindex.Client.release on asyncio."""
        req = pb.ReleaseRequest(request_id=request_id)
        return (await self._call("Release", self._stub.Release, req, timeout)).released

    async def workers(self, model: Optional[str] = None, timeout: Optional[float] = None) -> tuple[WorkerStatus, ...]:
        """kvindex.Client.workers on asyncio."""
        req = pb.ListWorkersRequest(model=model or "")
        resp = await self._call("ListWorkers", self._stub.ListWorkers, req, timeout)
        return tuple(worker_status(w) for w in resp.workers)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"kvindex.AsyncClient({self.target!r})"

    async def _call(self, method: str, rpc, req, timeout: Optional[float]):
        t = self.timeout if timeout is None else timeout
        try:
            return await rpc(req, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:  # grpc.aio.AioRpcError
            raise errors.from_rpc_error(e, method, self.target) from None
