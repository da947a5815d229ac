"""The two Ray Serve deployments (imports Ray: reached only through
``colibri.server.ray``, which checks that Ray is there first).

``ColibriReplica``: one loaded model and its ``create_app`` server, driven in-process
(asgi_bridge); Ray places the replicas (one per node, per NUMA node, or anywhere) and
routes to them. ``ColibriIngress``: the one HTTP entry (a FastAPI app on Ray Serve's
proxy) that forwards every request, whole, to a replica through a DeploymentHandle and
streams the answer back; the routing text it attaches (routing.py) is what Ray's
prefix-aware router matches. Requests are not parsed or validated here: the replica's app
does that, so the API surface is exactly ``colibri serve``'s."""

# No `from __future__ import annotations`: FastAPI reads the route's annotations at run
# time, and Ray Serve's ingress wrapper does not resolve string annotations.
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import ApiError
from . import asgi_bridge
from .config import ReplicaSpec
from .numa import NumaClaim, claim_numa_node
from .routing import ForwardedRequest, routing_text

REPLICA_HEADER = "x-colibri-replica"  # which replica answered (its Ray replica id)
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection"}


class ColibriReplica:
    """One replica: the model named by `spec`, served by its own ``create_app``."""

    def __init__(self, spec: ReplicaSpec) -> None:
        from ...model import Model
        from .. import create_app

        self.numa: NumaClaim | None = claim_numa_node() if spec.numa else None
        self.model = Model.load(spec.model, engine=spec.engine, cache_dir=spec.cache_dir,
                                download=spec.download, progress=False)
        self.app = create_app(self.model, **dict(spec.server), close_model=True)
        self.lifespan = asgi_bridge.Lifespan(self.app)
        self._started = asyncio.Lock()
        self._running = False
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    async def forward(self, req: ForwardedRequest) -> AsyncIterator[object]:
        """The response to `req`: a ResponseStart (with the replica header), then the
        body's pieces."""
        async with self._started:
            if not self._running:
                await self.lifespan.startup()
                self._running = True
        async for item in asgi_bridge.call(self.app, req):
            if isinstance(item, asgi_bridge.ResponseStart):
                item.headers.append((REPLICA_HEADER, self.replica_id))
            yield item

    async def __del__(self) -> None:
        # Ray Serve calls this at a graceful replica shutdown: drain, close the model.
        if self._running:
            self._running = False
            await self.lifespan.shutdown()


ingress_app = FastAPI(title="colibri (Ray Serve ingress)", docs_url=None, redoc_url=None,
                      openapi_url=None)


def _error(path: str, err: ApiError) -> JSONResponse:
    body = err.anthropic_body() if path.startswith("/v1/messages") else err.openai_body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)


@serve.ingress(ingress_app)
class ColibriIngress:
    """The HTTP entry: every route goes to a replica as it came."""

    def __init__(self, replicas: DeploymentHandle[Any]) -> None:
        self.replicas = replicas.options(stream=True)

    @ingress_app.api_route("/{path:path}",
                           methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
    async def forward(self, request: Request, path: str) -> Response:
        body = await request.body()
        method, url_path = request.method, "/" + path
        req = ForwardedRequest(method=method, path=url_path,
                               query_string=request.url.query.encode("latin-1"),
                               headers=list(request.headers.raw), body=body,
                               prompt=routing_text(method, url_path, body))
        gen: Any = self.replicas.forward.remote(req)
        try:
            head = await gen.__anext__()
        except BackPressureError:
            gen.cancel()
            return _error(url_path, ApiError(429, "every replica's queue is full; retry "
                                                  "later", code="queue_full",
                                             headers={"Retry-After": "1"}))
        except Exception as exc:
            gen.cancel()
            return _error(url_path, ApiError(503, f"no replica could take the request "
                                                  f"({type(exc).__name__}: {exc})",
                                             code="replica_unavailable",
                                             headers={"Retry-After": "1"}))
        assert isinstance(head, asgi_bridge.ResponseStart)
        headers = {k: v for k, v in head.headers if k not in _HOP_HEADERS}
        if not (head.header("content-type") or "").startswith("text/event-stream"):
            try:
                content = b"".join([bytes(piece) async for piece in gen])
            finally:
                gen.cancel()
            return Response(content, status_code=head.status, headers=headers)

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for piece in gen:
                    yield bytes(piece)
            finally:
                # The client went away (or the stream ended): stop the replica's side,
                # which cancels the generation there.
                with contextlib.suppress(Exception):
                    gen.cancel()

        return StreamingResponse(rest(), status_code=head.status, headers=headers)
