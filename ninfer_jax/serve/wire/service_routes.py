"""Falcon resources shared by the routes that sit on a protocol service (Responses, Anthropic
Messages): the body read under --max-request-mib, and the generate route that starts a run
and answers it as SSE or as one JSON body, as the request asked.

A service here has `ctx`, `start(body, request_id, peer)` returning a run whose
`request.stream` says which and whose `assembler` renders it (core/output.py), `run_stream(run)`
and `run_aggregate(run)`; a stream reports its own failures to the assembler.
"""
from __future__ import annotations

import falcon

from ninfer_jax.serve.wire.disconnect import peer_of
from ninfer_jax.serve.wire.http import MIB
from ninfer_jax.serve.wire.json_body import read_json_body
from ninfer_jax.serve.wire.sse import start_sse


class ServiceResource:
    def __init__(self, service):
        self.service = service

    def _body(self, req: falcon.Request) -> dict:
        return read_json_body(req, self.service.ctx.config.max_request_mib * MIB)


class GenerateResource(ServiceResource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        run = self.service.start(self._body(req), req.context.request_id, peer_of(req))
        if run.request.stream:
            start_sse(resp, self.service.run_stream(run))
            return
        with run.assembler.answering():
            resp.media = self.service.run_aggregate(run)
