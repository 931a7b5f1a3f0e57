"""The web app of ``toolexec ui``: pages, their live fragments, and the JSON API beside them.

Routes (each read is one or two pipelined Redis round trips, on Starlette's thread pool):

* ``/``: the recent runs and the live fleet; ``/fragments/runs`` and ``/fragments/fleet``
  are its live parts, which the page fetches again every 2 s;
* ``/runs/<run id>``: one run's calls on a timeline; ``/fragments/runs/<run id>`` is the
  timeline, fetched again every 0.5 s;
* ``/api/runs``, ``/api/runs/<run id>`` and ``/api/fleet``: the same, as JSON.

Access: with ``TOOLEXEC_UI_TOKEN`` set, every request must carry it, as a bearer token
(``Authorization: Bearer <token>``) or as ``?token=<token>`` once (the answer sets a
cookie, HttpOnly, SameSite=Strict, that carries it from then on). :func:`serve` refuses
to bind anything but loopback without a token.

Pages are server-rendered Jinja2 templates (``templates/``), escaped by default; the only
script is the base template's dozen lines that fetch a fragment and swap it in.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
import redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from toolexec.status import status_snapshot
from toolexec.ui.runs import LIVE, CallView, RunReader
from wire.clock import server_seconds
from wire.connect import sync_client
from wire.errors import ConfigurationError
from wire.settings import Settings

__all__ = ["COOKIE", "DEFAULT_HOST", "DEFAULT_PORT", "is_loopback", "make_app", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8777
#: The cookie that carries the token once a ``?token=`` request gave it.
COOKIE = "toolexec_ui_token"

_TEMPLATES = Path(__file__).parent / "templates"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _duration(ms: Any) -> str:
    if ms is None:
        return ""
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    return f"{ms / 60_000:.1f} min"


def _clock(ms: Any) -> str:
    if ms is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["duration"] = _duration
    env.filters["clock"] = _clock
    return env


def _now_ms(client: redis.Redis) -> int:
    return int(server_seconds(client.time()) * 1000)


#: The share of a timeline's track (percent) its bars span: the rest, on the right, is
#: for the marks of the calls that end last.
_LANE = 72.0


def _pct(ms: float, span: float) -> float:
    return round(_LANE * ms / span, 3)


def _timeline(calls: list[CallView], now: int) -> dict[str, Any]:
    """The geometry of a run's timeline: each call's bars and marks, and the axis."""
    starts = [c.sent_at if c.sent_at is not None else c.started_at for c in calls]
    first = min((s for s in starts if s is not None), default=now)
    ends = [
        now if c.status in LIVE else max(filter(None, (c.ended_at, c.ran_until, first)))
        for c in calls
    ]
    last = max([first + 1, *ends])
    span = float(last - first)
    rows = []
    for call, start in zip(calls, starts, strict=True):
        sent = start if start is not None else first
        end = now if call.status in LIVE else (call.ended_at or sent)
        ran_from = call.started_at
        bar: dict[str, Any] = {"queue": None, "run": None, "late": None}
        queue_end = ran_from if ran_from is not None else end
        if queue_end >= sent:
            bar["queue_left"], bar["queue"] = _pct(sent - first, span), _pct(queue_end - sent, span)
        if ran_from is not None:
            run_end = max(ran_from, end)
            bar["run_left"], bar["run"] = (
                _pct(ran_from - first, span),
                _pct(run_end - ran_from, span),
            )
        if call.ran_until is not None and call.ran_until > end:
            bar["late_left"], bar["late"] = (
                _pct(end - first, span),
                _pct(call.ran_until - end, span),
            )
        bar["end"] = _pct(max(end, call.ran_until or end) - first, span)
        rows.append(
            {
                **call.as_dict(),
                "bar": bar,
                "marks": _marks(call),
                "took": end - sent,
                "waited": (ran_from - sent) if ran_from is not None else (end - sent),
                "ran": (end - ran_from) if ran_from is not None else None,
            }
        )
    ticks = [
        {"at": _pct(span * at / 4, span), "label": _duration(span * at / 4)} for at in range(5)
    ]
    return {"calls": rows, "span": span, "ticks": ticks}


def _marks(call: CallView) -> list[dict[str, str]]:
    marks = []
    if call.joined:
        marks.append({"kind": "joined", "text": "from the store" if call.stored else "joined"})
    if call.resent:
        marks.append({"kind": "resent", "text": f"sent again ×{call.resent} (worker lost)"})
    if call.attempts > 1:
        marks.append({"kind": "retried", "text": f"{call.attempts} attempts"})
    if call.progress is not None and call.status in LIVE:
        total = call.progress.get("total")
        done = call.progress.get("done")
        marks.append(
            {"kind": "progress", "text": f"{done:g}/{total:g}" if total else f"{done:g} done"}
        )
    if call.status not in LIVE and call.status != "ok":
        marks.append({"kind": "end", "text": call.error_type or call.status})
    if call.ran_until is not None:
        marks.append({"kind": "late", "text": "ran on after its caller left"})
    if call.worker:
        where = f"{call.worker} ({call.pool})" if call.pool else call.worker
        marks.append({"kind": "worker", "text": where})
    return marks


class _TokenCheck(BaseHTTPMiddleware):
    """Every request carries the UI token, as a bearer token, a cookie or ``?token=``."""

    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self._token = token.encode()

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        query = request.query_params.get("token")
        if self._matches(bearer) or self._matches(request.cookies.get(COOKIE)):
            return await call_next(request)
        if self._matches(query):
            response = await call_next(request)
            response.set_cookie(COOKIE, query or "", httponly=True, samesite="strict")
            return response
        return PlainTextResponse(
            "toolexec ui: this server asks for its token (TOOLEXEC_UI_TOKEN): send "
            "'Authorization: Bearer <token>', or open the page once with ?token=<token>",
            status_code=401,
        )


def make_app(settings: Settings, client: redis.Redis | None = None) -> Starlette:
    """The app, reading the deployment ``settings`` name (``client``: its Redis, made from
    ``settings.redis_url`` when omitted)."""
    store = client or sync_client(
        settings.redis_url,
        master=settings.sentinel_master,
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
    )
    env = _environment()
    reader = RunReader(store)

    def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**context), status_code=status)

    def runs_context() -> dict[str, Any]:
        now = _now_ms(store)
        return {"runs": [r.as_dict() for r in reader.runs(now)], "now": now}

    def fleet() -> dict[str, Any]:
        try:
            snapshot = status_snapshot(
                store,
                broker_url=settings.broker_url,
                sentinel_master=settings.sentinel_master,
                redis_url=settings.redis_url,
            )
        except redis.RedisError as exc:
            return {"error": f"Redis cannot be read: {exc}"}
        for worker in snapshot["workers"]:
            worker["age"] = worker["heartbeat_age"] or 0.0
        return snapshot

    def run_context(run_id: str) -> dict[str, Any] | None:
        calls = reader.run(run_id)
        if calls is None:
            return None
        return {"run_id": run_id, **_timeline(calls, _now_ms(store))}

    def not_found(run_id: str) -> str:
        return f"no run {run_id!r} is logged (its log lapsed, or nothing was sent in it)"

    # Plain functions, not coroutines: Starlette runs them on its thread pool, so a slow
    # Redis holds up one request, never the server's event loop.
    def index(request: Request) -> Response:
        return page("index.html", fleet=fleet(), ttl=settings.run_log_ttl * 1000, **runs_context())

    def runs_fragment(request: Request) -> Response:
        return page("_runs.html", ttl=settings.run_log_ttl * 1000, **runs_context())

    def fleet_fragment(request: Request) -> Response:
        return page("_fleet.html", fleet=fleet())

    def run_view(template: str) -> Callable[[Request], Response]:
        def view(request: Request) -> Response:
            run_id = request.path_params["run_id"]
            context = run_context(run_id)
            if context is None and template == "run.html":
                # Still a page that refreshes: a run opened as it starts (its first call
                # not logged yet) shows its calls as they come.
                empty = _timeline([], 0)
                return page(template, 404, run_id=run_id, missing=not_found(run_id), **empty)
            if context is None:  # a fragment: the page keeps what it shows, and asks again
                return PlainTextResponse(not_found(run_id), status_code=404)
            return page(template, **context)

        return view

    def api_runs(request: Request) -> Response:
        return JSONResponse(runs_context())

    def api_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        calls = reader.run(run_id)
        if calls is None:
            return JSONResponse({"error": not_found(run_id)}, status_code=404)
        return JSONResponse({"run_id": run_id, "calls": [c.as_dict() for c in calls]})

    def api_fleet(request: Request) -> Response:
        data = fleet()
        return JSONResponse(data, status_code=503 if "error" in data else 200)

    token = settings.ui_token.get_secret_value() if settings.ui_token is not None else None
    return Starlette(
        routes=[
            Route("/", index),
            Route("/runs/{run_id:str}", run_view("run.html")),
            Route("/fragments/runs", runs_fragment),
            Route("/fragments/fleet", fleet_fragment),
            Route("/fragments/runs/{run_id:str}", run_view("_timeline.html")),
            Route("/api/runs", api_runs),
            Route("/api/runs/{run_id:str}", api_run),
            Route("/api/fleet", api_fleet),
        ],
        middleware=[Middleware(_TokenCheck, token=token)] if token else [],
    )


def serve(settings: Settings, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve the app on ``host``:``port`` until interrupted.

    Raises:
        ConfigurationError: ``host`` is not loopback and ``TOOLEXEC_UI_TOKEN`` is unset.
    """
    if not is_loopback(host) and settings.ui_token is None:
        raise ConfigurationError(
            f"toolexec ui will not serve on {host} without a token: anyone who can reach it "
            "would see every run; set TOOLEXEC_UI_TOKEN, or bind 127.0.0.1"
        )
    import uvicorn

    app = make_app(settings)
    print(f"toolexec ui: serving on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
