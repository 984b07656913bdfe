"""The dashboard's Starlette app: HTML pages, their JSON API, and the enqueue/status endpoints.

Every page has a JSON twin under ``/api`` that its script polls for live updates. The broker's
calls block, so page handlers are plain functions (Starlette runs them in its thread pool) and
the async ones (those reading a request body) hand the broker calls to the thread pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgtasks.dashboard import data
from pgtasks.dashboard.data import BadRequest, DeadFilter, TaskFilters
from pgtasks.dashboard.security import (
    COOKIE,
    DEFAULT_FORWARDED_ALLOW_IPS,
    READ_ONLY,
    SAFE_METHODS,
    ForwardedHeaders,
    LoginLimiter,
    Security,
    Sessions,
    TrustedProxies,
    local_path,
)
from pgtasks.exceptions import PgTasksError
from pgtasks.utils.humanize import duration

if TYPE_CHECKING:
    from pgtasks.app import Celery

HERE = Path(__file__).resolve().parent
#: Seconds between the pages' polls of the JSON API.
POLL_SECONDS = 3


class JSON(Response):
    """A JSON response that writes datetimes, bytes and exceptions as JSON can hold them."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return data.dumps(content).encode()


# -- templates ----------------------------------------------------------------------------------


def _dt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _firstline(value: Any, width: int = 120) -> str:
    if not value:
        return ""
    line = str(value).strip().splitlines()[0] if str(value).strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _pretty(value: Any) -> str:
    return json.dumps(data.jsonable(value), indent=2, sort_keys=True)


def chart_bars(series: Sequence[dict[str, Any]], height: int = 120, width: int = 600) -> list[Any]:
    """Stacked bars (completed, failed, other) of the per-minute series, as SVG rectangles."""
    top = max([p["total"] for p in series] + [1])
    step = width / max(len(series), 1)
    bars = []
    for i, point in enumerate(series):
        y = float(height)
        for kind in ("completed", "failed", "other"):
            h = point[kind] * height / top
            if h > 0:
                y -= h
                bars.append(
                    {
                        "x": round(i * step + 1, 2),
                        "y": round(y, 2),
                        "w": round(max(step - 2, 1), 2),
                        "h": round(h, 2),
                        "kind": kind,
                        "title": f"{_dt(point['minute'])[11:16]} UTC: {point[kind]} {kind}",
                    }
                )
    return bars


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        dt=_dt,
        age=duration,
        firstline=_firstline,
        pretty=_pretty,
        q=lambda v: quote(str(v), safe=""),
    )
    env.globals.update(statuses=data.STATUSES, chart_bars=chart_bars, urlencode=urlencode)
    return env


# -- the app ------------------------------------------------------------------------------------


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _refuse(
    request: Request, status: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    headers = {**(headers or {}), **({"WWW-Authenticate": "Bearer"} if status == 401 else {})}
    if _is_api(request):
        return JSON({"error": message}, status_code=status, headers=headers)
    return PlainTextResponse(message, status_code=status, headers=headers)


def _too_many(wait: int) -> str:
    return f"too many wrong tokens from your address: try again in {wait} s"


class Guard(BaseHTTPMiddleware):
    """Host, origin, token, session and CSRF checks (see :mod:`pgtasks.dashboard.security`),
    and the security headers of every response."""

    def __init__(self, app: Any, security: Security) -> None:
        super().__init__(app)
        self.security = security

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._check(request, call_next)
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    async def _check(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        sec = self.security
        request.state.session = None
        if not sec.host_allowed(request):
            return PlainTextResponse(
                "this dashboard answers only to localhost, 127.0.0.1 or [::1] when it has no "
                "token; start it with a token to reach it by another name",
                status_code=400,
            )
        unsafe = request.method not in SAFE_METHODS
        if sec.read_only:
            return _refuse(request, 403, READ_ONLY) if unsafe else await call_next(request)
        given = sec.bearer(request)
        if given is not None:
            # An API client: the token itself, on every request. No cookie is involved, so
            # no other site's page can make a browser send it.
            client = sec.client(request)
            wait = sec.limiter.wait(client)
            if wait:
                return _refuse(request, 429, _too_many(wait), {"Retry-After": str(wait)})
            if not sec.token_ok(given):
                sec.limiter.failed(client)
                return _refuse(request, 401, "wrong token")
            return await call_next(request)
        path = request.url.path
        session = request.state.session = sec.session(request)
        public = path.startswith("/static/") or path in ("/login", "/logout")
        if session is None and not public:
            if request.method == "GET" and not _is_api(request):
                target = path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
            return _refuse(
                request, 401, "this dashboard needs its token: Authorization: Bearer TOKEN"
            )
        if unsafe and not sec.same_origin(request):
            return _refuse(request, 403, "refused: this request came from another site's page")
        # The forms' CSRF field is checked where each form is read; the API's is a header.
        if unsafe and _is_api(request) and not sec.csrf_ok(request, request.headers.get(CSRF)):
            return _refuse(
                request,
                403,
                f"a change through the API needs Authorization: Bearer TOKEN (or, from a "
                f"logged-in page, its CSRF token in {CSRF})",
            )
        return await call_next(request)


#: The header that carries a logged-in page's CSRF token to the JSON API.
CSRF = "X-CSRF-Token"


def create_app(
    celery_app: Celery,
    token: str | None = None,
    *,
    allowed_hosts: Sequence[str] | None = None,
    poll_seconds: float = POLL_SECONDS,
    forwarded_allow_ips: str | Sequence[str] = DEFAULT_FORWARDED_ALLOW_IPS,
    sessions: Sessions | None = None,
    limiter: LoginLimiter | None = None,
) -> Starlette:
    """The dashboard of ``celery_app``.

    ``token``: when given (at least 16 characters, else :class:`WeakToken`), every page and API
    call needs it (``Authorization: Bearer``, or the login form's session cookie). Without it
    the dashboard is read-only, and requests must name a loopback host; serve it on a loopback
    address only (see :func:`pgtasks.dashboard.security.check_bind`). ``allowed_hosts`` adds
    ``Host`` names accepted without a token (``"*"``: any). ``poll_seconds``: how often pages
    refresh. ``forwarded_allow_ips``: the proxies whose ``X-Forwarded-Proto`` and
    ``X-Forwarded-For`` are believed (addresses or networks, ``"*"`` for any). ``sessions`` and
    ``limiter``: how long a login lasts and how many wrong tokens a client may send (defaults:
    12 hours; 5 a minute).
    """
    security = Security(token, allowed_hosts, sessions=sessions, limiter=limiter)
    trusted = TrustedProxies(forwarded_allow_ips)
    env = _environment()
    app = celery_app

    def render(
        request: Request, name: str, view: str, api: str | None, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        headers = ctx.pop("headers", None)
        context = {
            "request": request,
            "view": view,
            "api": api,
            "poll_ms": max(100, int(poll_seconds * 1000)),
            "csrf": security.csrf_for(getattr(request.state, "session", None)),
            "token_mode": security.token is not None,
            "read_only": security.read_only,
            "read_only_reason": READ_ONLY,
            "flash": security.signed(
                request.query_params.get("done"), request.query_params.get("sig")
            ),
            **ctx,
        }
        page = env.get_template(name).render(context)
        return HTMLResponse(page, status_code=status, headers=headers)

    def with_query(path: str, request: Request) -> str:
        return path + (f"?{request.url.query}" if request.url.query else "")

    def who(request: Request) -> str:
        return f"dashboard@{request.client.host if request.client else 'unknown'}"

    # -- pages ----------------------------------------------------------------------------------

    def overview_page(request: Request) -> Response:
        return render(request, "overview.html", "overview", "/api/overview", **data.overview(app))

    def queues_page(request: Request) -> Response:
        return render(request, "queues.html", "queues", "/api/queues", **data.queues(app))

    def tasks_page(request: Request) -> Response:
        filters = TaskFilters.parse(request.query_params)
        found = data.tasks(app, filters)
        prev_q = urlencode(filters.query(page=filters.page - 1)) if filters.page > 1 else None
        next_q = urlencode(filters.query(page=filters.page + 1)) if found["has_next"] else None
        return render(
            request,
            "tasks.html",
            "tasks",
            with_query("/api/tasks", request),
            prev_q=prev_q,
            next_q=next_q,
            **found,
        )

    def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        found = data.task_detail(app, task_id)
        if found is None:
            return render(
                request,
                "missing.html",
                "task",
                None,
                status=404,
                task_id=task_id,
                status_info=data.task_status(app, task_id),
            )
        return render(
            request,
            "task.html",
            "task",
            f"/api/tasks/{quote(task_id, safe='')}/detail",
            task=found,
        )

    def dead_letters_page(request: Request) -> Response:
        params = request.query_params
        page = data.parse_int(params.get("page"), "page", 1, 1, 1_000_000)
        limit = data.parse_int(params.get("limit"), "limit", 50, 1, data.MAX_LIMIT)
        shown = DeadFilter.parse(params.get("task"), params.get("queue"))
        found = data.dead_letters(app, shown.task, shown.queue, page, limit)
        kept = [(k, v) for k, v in params.multi_items() if k not in ("done", "sig")]
        keep = shown.query()
        if limit != 50:
            keep["limit"] = str(limit)
        prev_q = urlencode({**keep, "page": page - 1}) if page > 1 else None
        next_q = urlencode({**keep, "page": page + 1}) if found["has_next"] else None
        return render(
            request,
            "dead_letters.html",
            "dead-letters",
            with_query("/api/dead-letters", request),
            prev_q=prev_q,
            next_q=next_q,
            here="/dead-letters" + (f"?{urlencode(kept)}" if kept else ""),
            shown=shown,
            **found,
        )

    def schedules_page(request: Request) -> Response:
        return render(
            request, "schedules.html", "schedules", "/api/schedules", **data.schedules(app)
        )

    async def dead_letters_action(request: Request) -> Response:
        """A row's own button acts at once on that row. The bulk buttons first show what they
        would change (how many, which filter, the first rows) and act only when that page is
        confirmed, on that set and never on more."""
        form = await _form(request)
        if not security.csrf_ok(request, _field(form, "csrf")):
            return PlainTextResponse(
                "the form has expired (or came from another site): reload the page",
                status_code=403,
            )
        back = local_path(_field(form, "next"), "/dead-letters")
        asked = _form_selection(form)
        if asked.scope == "one" or asked.confirmed:
            return await _bulk_change(request, asked, back)
        return await _confirm(request, asked, back)

    async def _confirm(
        request: Request, asked: FormSelection, back: str, notice: str | None = None
    ) -> Response:
        if asked.scope == "all":
            found = await run_in_threadpool(data.dead_set, app, asked.filter)
            count, until, sample = len(found.ids), found.until, found.sample
        else:
            count, until, sample = len(asked.ids), None, [{"id": i} for i in asked.ids]
        verb = "Requeue" if asked.verb == "requeue" else "Discard"
        what = data.dead_letters_phrase(count, asked.filter)
        if asked.scope == "selected":
            what = f"the {count:,} selected " + ("dead letter" if count == 1 else "dead letters")
        return render(
            request,
            "confirm.html",
            "dead-letters",
            None,
            status=409 if notice else 200,
            notice=notice,
            verb=asked.verb,
            question=f"{verb} {what}?" if count else None,
            button=f"{verb} {data.dead_letters_phrase(count)}",
            empty=f"No dead letters{asked.filter.describe()}: nothing to {asked.verb}.",
            scope=asked.scope,
            filter=asked.filter,
            ids=asked.ids,
            count=count,
            until=until.isoformat() if until else "",
            sample=sample,
            more=max(0, count - len(sample)),
            back=back,
        )

    async def _bulk_change(request: Request, asked: FormSelection, back: str) -> Response:
        ids = asked.ids
        if asked.scope == "all":
            found = await run_in_threadpool(data.dead_set, app, asked.filter, asked.until)
            if asked.count is None or len(found.ids) > asked.count:
                shown = "?" if asked.count is None else f"{asked.count:,}"
                notice = (
                    f"The dead letters changed since they were shown: {len(found.ids):,} match "
                    f"now where {shown} were shown. Nothing was changed; check and confirm again."
                )
                return await _confirm(request, asked, back, notice)
            ids = found.ids
        if asked.verb == "requeue":
            count = await run_in_threadpool(app.broker.requeue_dead, ids, by=who(request))
            done = f"Requeued {data.dead_letters_phrase(count, asked.filter)}."
        else:
            count = await run_in_threadpool(app.broker.discard_dead, ids)
            done = f"Discarded {data.dead_letters_phrase(count, asked.filter)}."
        expected = len(ids) if asked.count is None else asked.count
        if count < expected:
            gone = expected - count
            done += (
                f" {gone:,} of the {expected:,} shown "
                + ("was" if gone == 1 else "were")
                + " no longer a dead letter."
            )
        separator = "&" if "?" in back else "?"
        told = urlencode({"done": done, "sig": security.sign(done)})
        return RedirectResponse(back + separator + told, status_code=303)

    def login_page(request: Request) -> Response:
        if security.token is None:
            return RedirectResponse("/", status_code=303)
        return render(
            request,
            "login.html",
            "login",
            None,
            next=local_path(request.query_params.get("next")),
            error=None,
        )

    async def login(request: Request) -> Response:
        form = await _form(request)
        target = local_path(_field(form, "next"))
        client = security.client(request)
        wait = security.limiter.wait(client)
        if wait:
            return render(
                request,
                "login.html",
                "login",
                None,
                status=429,
                next=target,
                error=_too_many(wait).capitalize() + ".",
                headers={"Retry-After": str(wait)},
            )
        if not security.token_ok(_field(form, "token")):
            security.limiter.failed(client)
            return render(
                request, "login.html", "login", None, status=401, next=target, error="Wrong token."
            )
        security.limiter.succeeded(client)
        # A new id at every login: one planted in the browser beforehand is worth nothing.
        security.sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            security.sessions.create(),
            max_age=int(security.sessions.lifetime),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        session = request.state.session
        if session is not None:
            form = await _form(request)
            if not security.csrf_ok(request, _field(form, "csrf")):
                return PlainTextResponse("the form has expired: reload the page", status_code=403)
            security.sessions.end(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(
            COOKIE,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    # -- the JSON API ---------------------------------------------------------------------------

    def api_overview(request: Request) -> Response:
        return JSON(data.overview(app))

    def api_queues(request: Request) -> Response:
        return JSON(data.queues(app))

    def api_tasks(request: Request) -> Response:
        return JSON(data.tasks(app, TaskFilters.parse(request.query_params)))

    def api_task(request: Request) -> Response:
        return JSON(data.task_status(app, request.path_params["task_id"]))

    def api_task_detail(request: Request) -> Response:
        found = data.task_detail(app, request.path_params["task_id"])
        if found is None:
            return JSON({"error": "no such task"}, status_code=404)
        return JSON(found)

    def api_dead_letters(request: Request) -> Response:
        params = request.query_params
        shown = DeadFilter.parse(params.get("task"), params.get("queue"))
        return JSON(
            data.dead_letters(
                app,
                shown.task,
                shown.queue,
                data.parse_int(params.get("page"), "page", 1, 1, 1_000_000),
                data.parse_int(params.get("limit"), "limit", 50, 1, data.MAX_LIMIT),
            )
        )

    def api_schedules(request: Request) -> Response:
        return JSON(data.schedules(app))

    async def api_enqueue(request: Request) -> Response:
        body = await _json_body(request)
        try:
            task_id = await run_in_threadpool(data.enqueue, app, body)
        except (PgTasksError, ValueError) as exc:
            raise BadRequest(str(exc)) from None
        return JSON({"id": task_id}, status_code=202)

    async def api_change(request: Request, verb: str) -> Response:
        asked = data.selection(await _json_body(request))
        ids = asked.ids
        if ids is None:
            found = await run_in_threadpool(data.dead_set, app, asked.filter)
            if asked.expect is not None and len(found.ids) > asked.expect:
                matching = data.dead_letters_phrase(len(found.ids), asked.filter)
                return JSON(
                    {
                        "error": f"{matching} match, more than the {asked.expect} expected: "
                        f"nothing was {verb}d",
                        "matching": len(found.ids),
                    },
                    status_code=409,
                )
            ids = found.ids
        task_name = asked.filter.task if asked.ids is not None else None
        if verb == "requeue":
            by = who(request)
            count = await run_in_threadpool(app.broker.requeue_dead, ids, task_name, by=by)
            return JSON({"requeued": count})
        count = await run_in_threadpool(app.broker.discard_dead, ids, task_name)
        return JSON({"discarded": count})

    async def api_requeue(request: Request) -> Response:
        return await api_change(request, "requeue")

    async def api_discard(request: Request) -> Response:
        return await api_change(request, "discard")

    # -- errors ---------------------------------------------------------------------------------

    def error_page(request: Request, status: int, message: str) -> Response:
        if _is_api(request):
            return JSON({"error": message}, status_code=status)
        return render(request, "error.html", "error", None, status=status, message=message)

    def bad_request(request: Request, exc: Exception) -> Response:
        status = exc.status if isinstance(exc, BodyTooLarge) else 400
        return error_page(request, status, str(exc))

    def bad_value(request: Request, exc: Exception) -> Response:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return error_page(request, 400, f"the database cannot take this value: {first}")

    def unavailable(request: Request, exc: Exception) -> Response:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return error_page(request, 503, f"cannot reach the database: {first}")

    def no_schema(request: Request, exc: Exception) -> Response:
        message = "the pgtasks schema does not exist in this database; run `pgtasks migrate`"
        return error_page(request, 503, message)

    def server_error(request: Request, exc: Exception) -> Response:
        # The details never reach the page (they may name tables, paths, values): Starlette
        # raises the exception on after this answer, and the server logs its traceback.
        return error_page(request, 500, "internal error: the dashboard's log has the details")

    routes = [
        Route("/", overview_page),
        Route("/queues", queues_page),
        Route("/tasks", tasks_page),
        Route("/tasks/{task_id}", task_page),
        Route("/dead-letters", dead_letters_page),
        Route("/dead-letters", dead_letters_action, methods=["POST"]),
        Route("/schedules", schedules_page),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/overview", api_overview),
        Route("/api/queues", api_queues),
        Route("/api/tasks", api_tasks),
        Route("/api/tasks", api_enqueue, methods=["POST"]),
        Route("/api/tasks/{task_id}", api_task),
        Route("/api/tasks/{task_id}/detail", api_task_detail),
        Route("/api/dead-letters", api_dead_letters),
        Route("/api/dead-letters/requeue", api_requeue, methods=["POST"]),
        Route("/api/dead-letters/discard", api_discard, methods=["POST"]),
        Route("/api/schedules", api_schedules),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Response]] = {
        BadRequest: bad_request,
        psycopg.DataError: bad_value,
        psycopg.OperationalError: unavailable,
        psycopg.errors.UndefinedTable: no_schema,
        Exception: server_error,
    }
    starlette = Starlette(
        routes=routes,
        middleware=[
            Middleware(ForwardedHeaders, trusted=trusted),
            Middleware(Guard, security=security),
        ],
        exception_handlers=handlers,
    )
    starlette.state.celery_app = celery_app
    starlette.state.security = security
    return starlette


# -- request bodies -----------------------------------------------------------------------------


Form = dict[str, list[str]]
#: The largest request body read, a form or JSON (a form with a page of checked rows, or a
#: JSON list of 20,000 ids, is less).
MAX_BODY_BYTES = 1 << 20


class BodyTooLarge(BadRequest):
    """A request body past :data:`MAX_BODY_BYTES` (answered with 413)."""

    status = 413


async def _body(request: Request) -> bytes:
    """The request's body, refused past :data:`MAX_BODY_BYTES` before more of it is read."""
    too_large = BodyTooLarge(f"the request body is larger than {MAX_BODY_BYTES:,} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_large
    return bytes(raw)


async def _form(request: Request) -> Form:
    """The request's url-encoded form (what the dashboard's own forms send)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise BadRequest("send the form url-encoded")
    raw = await _body(request)
    try:
        return parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=10_000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the form cannot be read: {exc}") from None


def _field(form: Form, name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


@dataclass(frozen=True)
class FormSelection:
    """What the dead-letters form asks: ``verb`` (requeue, discard) on ``scope`` "one" (a row's
    own button), "selected" (the checked ``ids``) or "all" (every one matching ``filter``);
    ``confirmed`` once the confirmation page was accepted, with the ``count`` and ``until`` of
    the set it showed."""

    verb: str
    scope: str
    ids: list[str]
    filter: DeadFilter
    confirmed: bool = False
    count: int | None = None
    until: datetime | None = None


def _form_selection(form: Form) -> FormSelection:
    found = DeadFilter.parse(_field(form, "task"), _field(form, "queue"))
    for verb in ("requeue", "discard"):
        one = _field(form, f"{verb}_one")
        if one:
            return FormSelection(verb, "one", [one], DeadFilter())
    action = _field(form, "action") or ""
    verb, _, scope = action.partition("_")
    if verb not in ("requeue", "discard") or scope not in ("selected", "all"):
        raise BadRequest("unknown action")
    confirmed = _field(form, "confirmed") == "yes"
    if scope == "selected":
        ids = list(dict.fromkeys(v for v in form.get("ids", []) if v))
        if not ids:
            raise BadRequest("no dead letter selected: tick the rows to change first")
        return FormSelection(verb, scope, ids, DeadFilter(), confirmed)
    count = until = None
    if confirmed:
        count = data.parse_int(_field(form, "count"), "count", 0, 0, data.BULK_MAX)
        when = _field(form, "until")
        try:
            until = datetime.fromisoformat(when) if when else None
        except ValueError:
            raise BadRequest("until: expected the time the confirmation page showed") from None
        if until is not None and until.tzinfo is None:
            raise BadRequest("until: expected a time with its offset")
    return FormSelection(verb, scope, [], found, confirmed, count, until)


async def _json_body(request: Request) -> Any:
    """The request's JSON body. A browser can send JSON to another site only after asking that
    site first (CORS), which this one never allows, so the content type is required."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest("send a JSON body with Content-Type: application/json")
    raw = await _body(request)
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
