"""A router in the shape of vLLM production-stack's routing logic, on
asyncio as that router (and semantic routers, LiteLLM proxies) runs: given
an OpenAI request body, return the URL of the engine to send it to. It asks
kvindex, which knows what every engine has cached, and falls back to round
robin whenever kvindex cannot answer in time (a router must never wait on
its cache index, nor block its event loop). Needs `pip install
./clients/python`; clients/python/tests exercise it."""

import itertools
import logging

import kvindex

log = logging.getLogger("router")


class KvindexRouter:
    def __init__(self, kv: kvindex.AsyncClient, model: str, engines: dict):
        """engines maps each engine's pod name, as kvindex's configuration
        names it, to its base URL."""
        self.kv, self.model, self.engines = kv, model, dict(engines)
        self._rr = itertools.cycle(sorted(self.engines.values()))
        self.fallbacks = 0

    async def route_request(self, request: dict, request_id: str) -> str:
        """Returns the base URL of the engine for request; await
        on_request_done(request_id) when its prefill is done or it failed."""
        text = {"messages": request["messages"]} if "messages" in request else {"prompt": request.get("prompt", "")}
        try:
            r = await self.kv.route(self.model, request_id, workers=list(self.engines), **text)
            return self.engines[r.chosen.pod]
        except kvindex.KvindexError as e:  # unavailable, overloaded, late, refused: never block the request
            log.warning("kvindex could not route %s, round robin: %s", request_id, e)
            self.fallbacks += 1
            return next(self._rr)

    async def on_request_done(self, request_id: str) -> None:
        try:
            await self.kv.release(request_id)
        except kvindex.KvindexError as e:  # kvindex expires it after its inflight_ttl
            log.warning("kvindex release %s: %s", request_id, e)
