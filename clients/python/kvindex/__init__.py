"""kvindex's Python client: ask a kvindex server which vLLM worker already
holds a prompt's KV-cache prefix (score), route a request there and record
it (route, release), and list the workers' health (workers).

    import kvindex
    with kvindex.Client("localhost:50051") as kv:
        r = kv.route("meta-llama/Llama-3.1-8B-Instruct", "req-1", prompt="Once upon")
        print(r.chosen.pod)
        kv.release("req-1")

The stubs in kvindex.v1 are generated from proto/kvindex/v1 by `make proto`
(never edited); the rest is a thin typed layer over them. Needs Python 3.9
or newer, grpcio and protobuf 3.21 or newer (Debian bookworm's python3,
python3-grpcio, python3-protobuf).
"""

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
