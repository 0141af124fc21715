"""The values a Client returns: frozen dataclasses, not protobuf messages,
so that a router can keep, compare and hash them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from kvindex.v1 import index_pb2 as pb

__all__ = ["Worker", "MediumMatch", "Load", "WorkerScore", "ScoreResult", "RouteResult", "WorkerStatus", "TLS"]


@dataclass(frozen=True, order=True)
class Worker:
    """One KV cache: an engine pod (as named in kvindex's configuration)
    and its data-parallel rank (0 without data parallelism)."""

    pod: str
    dp_rank: int = 0

    def __str__(self) -> str:
        return f"{self.pod}/{self.dp_rank}"


@dataclass(frozen=True)
class MediumMatch:
    """A worker's consecutive cached prefix within one medium ("GPU", "CPU",
    "STORAGE", "DISK", "EXTERNAL", "OTHER")."""

    medium: str
    blocks: int
    tokens: int


@dataclass(frozen=True)
class Load:
    """A worker's load as the ranking saw it; source says where running and
    waiting came from ("request", "scrape", "none")."""

    running: int
    waiting: int
    kv_cache_usage: float
    inflight_requests: int
    inflight_prefill_tokens: int
    queued_prefill_tokens: int
    source: str


@dataclass(frozen=True)
class WorkerScore:
    """One worker's match of the prompt. matched_blocks is the prefix,
    consecutive from the first block, the worker holds; speculative_blocks
    of them are only expected (a recent Route sent the prefix there);
    score ranks (higher is better); health is the WorkerHealth name without
    its prefix ("OK", "STALE", ...)."""

    worker: Worker
    matched_blocks: int
    matched_tokens: int
    speculative_blocks: int
    by_medium: Tuple[MediumMatch, ...]
    health: str
    overlap: float
    score: float
    penalty: float
    load: Optional[Load]
    reason: str


@dataclass(frozen=True)
class ScoreResult:
    """A ranking, best first: block_size is the model's tokens per block,
    prompt_blocks the prompt's full blocks, policy the policy that ranked."""

    block_size: int
    prompt_blocks: int
    workers: Tuple[WorkerScore, ...]
    policy: str

    @property
    def best(self) -> Optional[WorkerScore]:
        """The first-ranked worker, None when no worker was ranked."""
        return self.workers[0] if self.workers else None

    def of(self, worker: Worker) -> Optional[WorkerScore]:
        """The score of worker, None when the answer does not rank it (it
        holds nothing of the prompt and no policy or candidate asked)."""
        return next((w for w in self.workers if w.worker == worker), None)


@dataclass(frozen=True)
class RouteResult:
    """The worker a routed request was recorded against, and the ranking
    the choice was made from."""

    chosen: Worker
    ranking: ScoreResult


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's state from ListWorkers: its model, event endpoint,
    health (and why it is not OK), whether kvindex is connected to it, the
    blocks it holds, its event-stream losses and what Route has in flight
    on it."""

    worker: Worker
    model: str
    endpoint: str
    health: str
    health_reason: str
    connected: bool
    resident_blocks: int
    gaps: int
    restarts: int
    inflight_requests: int
    inflight_prefill_tokens: int


@dataclass(frozen=True)
class TLS:
    """Transport security for a Client. ca is the PEM bundle that signs the
    server's certificate (None: the system's roots); cert and key the
    client's certificate and key for mTLS (both or neither); server_name
    overrides the name the server's certificate is checked against (when
    the target is an address the certificate does not name). Each of ca,
    cert and key is a file path, or the PEM itself as bytes."""

    ca: Optional[object] = None
    cert: Optional[object] = None
    key: Optional[object] = None
    server_name: Optional[str] = None


def _health(v: int) -> str:
    return pb.WorkerHealth.Name(v).removeprefix("WORKER_HEALTH_") if v in pb.WorkerHealth.values() else str(v)


def _worker(m: pb.WorkerRef) -> Worker:
    return Worker(m.pod, m.dp_rank)


def score_result(m: pb.ScoreResponse) -> ScoreResult:
    """Converts a ScoreResponse."""
    return ScoreResult(
        block_size=m.block_size,
        prompt_blocks=m.prompt_blocks,
        policy=m.policy,
        workers=tuple(
            WorkerScore(
                worker=_worker(w.worker),
                matched_blocks=w.matched_blocks,
                matched_tokens=w.matched_tokens,
                speculative_blocks=w.speculative_blocks,
                by_medium=tuple(MediumMatch(x.medium, x.blocks, x.tokens) for x in w.by_medium),
                health=_health(w.health),
                overlap=w.overlap,
                score=w.score,
                penalty=w.penalty,
                load=_load(w.load) if w.HasField("load") else None,
                reason=w.reason,
            )
            for w in m.workers
        ),
    )


def _load(m: pb.LoadDetail) -> Load:
    return Load(
        m.running,
        m.waiting,
        m.kv_cache_usage,
        m.inflight_requests,
        m.inflight_prefill_tokens,
        m.queued_prefill_tokens,
        m.source,
    )


def route_result(m: pb.RouteResponse) -> RouteResult:
    """Converts a RouteResponse."""
    return RouteResult(chosen=_worker(m.chosen), ranking=score_result(m.ranking))


def worker_status(m: pb.WorkerStatus) -> WorkerStatus:
    """Converts a WorkerStatus."""
    return WorkerStatus(
        worker=_worker(m.worker),
        model=m.model,
        endpoint=m.endpoint,
        health=_health(m.health),
        health_reason=m.health_reason,
        connected=m.connected,
        resident_blocks=m.resident_blocks,
        gaps=m.gaps,
        restarts=m.restarts,
        inflight_requests=m.inflight_requests,
        inflight_prefill_tokens=m.inflight_prefill_tokens,
    )
