"""kvindex's Python client: ask a kvindex server which vLLM worker already
holds a prompt's KV-cache prefix (score), route a request there and record
it (route, release), and list the workers' health (workers). Client
blocks; AsyncClient is the same on asyncio.

    import kvindex
    with kvindex.Client("localhost:50051") as kv:
        r = kv.route("meta-llama/Llama-3.1-8B-Instruct", "req-1", prompt="Once upon")
        print(r.chosen.pod)
        kv.release("req-1")

    async with kvindex.AsyncClient("localhost:50051") as kv:
        r = await kv.route("meta-llama/Llama-3.1-8B-Instruct", "req-2", prompt="Once upon")
        await kv.release("req-2")

Installed with `pip install ./clients/python` (pyproject.toml).

The stubs in kvindex.v1 are generated from proto/kvindex/v1 by `make proto`
(never edited); the rest is a thin typed layer over them. Needs Python 3.9
or newer, grpcio and protobuf 3.21 or newer (Debian bookworm's python3,
python3-grpcio, python3-protobuf).
"""

from kvindex.aio import AsyncClient
from kvindex.client import Client
from kvindex.errors import (
    DeadlineExceeded,
    InvalidArgument,
    KvindexError,
    Overloaded,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from kvindex.values import TLS, Load, MediumMatch, RouteResult, ScoreResult, Worker, WorkerScore, WorkerStatus

__all__ = [
    "Client",
    "AsyncClient",
    "TLS",
    "Worker",
    "ScoreResult",
    "WorkerScore",
    "MediumMatch",
    "Load",
    "RouteResult",
    "WorkerStatus",
    "KvindexError",
    "InvalidArgument",
    "Overloaded",
    "ResourceExhausted",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
]
