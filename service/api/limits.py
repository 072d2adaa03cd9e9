"""Limits on a request: its body (a declared or streamed body over `max_bytes` gets 413 before any route
runs) and how long it waits on the ledger's database (`LedgerPatience`)."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import answer


class BodyTooLargeError(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status_code=413,
            detail=f"the request body is over the limit of {max_bytes:,} bytes "
            "(MEMSWEEP_MAX_REQUEST_BYTES); send a smaller spec",
        )


class BodyLimit:
    """Pure ASGI middleware; an HTTPException, so FastAPI's body reading passes it on as a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLargeError:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = BodyTooLargeError(self.max_bytes)
        refusal = JSONResponse(answer(error.detail), status_code=413)  # every error answer's shape
        await refusal(scope, receive, send)


#: seconds a request's ledger calls wait on a database that does not answer (or refuses writes) before
#: the request is answered 503; the engine's own calls wait `service.store.patience.OUTAGE_PATIENCE`
REQUEST_LEDGER_PATIENCE = 5.0


class LedgerPatience:
    """Pure ASGI middleware: a request's ledger calls retry an unreachable database for
    REQUEST_LEDGER_PATIENCE seconds, not the engine's two minutes (an unwritable ledger held a POST for
    116 s, then answered 500); the route's thread inherits it (anyio copies the context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from service.store.patience import PATIENCE

        token = PATIENCE.set(REQUEST_LEDGER_PATIENCE)
        try:
            await self.app(scope, receive, send)
        finally:
            PATIENCE.reset(token)
