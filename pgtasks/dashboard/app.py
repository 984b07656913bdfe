"""The dashboard's Starlette app: HTML pages, their JSON API, and the enqueue/status endpoints.

Every page has a JSON twin under ``/api`` that its script polls for live updates. The broker's
calls block, so page handlers are plain functions (Starlette runs them in its thread pool) and
the async ones (those reading a request body) hand the broker calls to the thread pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
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
from pgtasks.dashboard.data import BadRequest, TaskFilters
from pgtasks.dashboard.security import COOKIE, SAFE_METHODS, Security, local_path
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


def _refuse(request: Request, status: int, message: str) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if _is_api(request):
        return JSON({"error": message}, status_code=status, headers=headers)
    return PlainTextResponse(message, status_code=status, headers=headers)


class Guard(BaseHTTPMiddleware):
    """Host, origin, token and loopback checks (see :mod:`pgtasks.dashboard.security`), and
    the security headers of every response."""

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
        if not sec.host_allowed(request):
            return PlainTextResponse(
                "this dashboard answers only to localhost, 127.0.0.1 or [::1] when it has no "
                "token; start it with --token to reach it by another name",
                status_code=400,
            )
        path = request.url.path
        unsafe = request.method not in SAFE_METHODS
        bearer = sec.bearer(request) is not None and sec.bearer_ok(request)
        request.state.bearer = bearer
        if unsafe and not bearer and not sec.same_origin(request):
            return _refuse(request, 403, "refused: this request came from another site's page")
        public = path.startswith("/static/") or path == "/login"
        if sec.token is not None:
            if sec.bearer(request) is not None and not bearer:
                return _refuse(request, 401, "wrong token")
            if not public and not (bearer or sec.cookie_ok(request)):
                if request.method == "GET" and not _is_api(request):
                    target = path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(
                        "/login?" + urlencode({"next": target}), status_code=303
                    )
                return _refuse(
                    request, 401, "this dashboard needs its token: Authorization: Bearer TOKEN"
                )
        elif unsafe and path != "/login" and not sec.client_is_loopback(request):
            return _refuse(
                request,
                403,
                "changes are accepted only from this machine when the dashboard has no token",
            )
        return await call_next(request)


def create_app(
    celery_app: Celery,
    token: str | None = None,
    *,
    allowed_hosts: Sequence[str] | None = None,
    poll_seconds: float = POLL_SECONDS,
) -> Starlette:
    """The dashboard of ``celery_app``.

    ``token``: when given, every page and API call needs it (``Authorization: Bearer``, or the
    login form's cookie). Without it, requests must name a loopback host and changes are
    accepted only from loopback clients; serve it on a loopback address only (see
    :func:`pgtasks.dashboard.security.check_bind`). ``allowed_hosts`` adds ``Host`` names
    accepted without a token (``"*"``: any). ``poll_seconds``: how often pages refresh.
    """
    security = Security(token, allowed_hosts)
    env = _environment()
    app = celery_app

    def render(
        request: Request, name: str, view: str, api: str | None, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        context = {
            "request": request,
            "view": view,
            "api": api,
            "poll_ms": max(100, int(poll_seconds * 1000)),
            "csrf": security.csrf,
            "token_mode": security.token is not None,
            "flash": request.query_params.get("done"),
            **ctx,
        }
        return HTMLResponse(env.get_template(name).render(context), status_code=status)

    def with_query(path: str, request: Request) -> str:
        return path + (f"?{request.url.query}" if request.url.query else "")

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
        task_name = params.get("task") or None
        queue = params.get("queue") or None
        found = data.dead_letters(app, task_name, queue, page, limit)
        kept = [(k, v) for k, v in params.multi_items() if k != "done"]
        keep = {k: v for k, v in (("task", task_name), ("queue", queue)) if v}
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
            **found,
        )

    def schedules_page(request: Request) -> Response:
        return render(
            request, "schedules.html", "schedules", "/api/schedules", **data.schedules(app)
        )

    async def dead_letters_action(request: Request) -> Response:
        form = await _form(request)
        if not security.csrf_ok(_field(form, "csrf")):
            return PlainTextResponse(
                "the form has expired (or came from another site): reload the page",
                status_code=403,
            )
        back = local_path(_field(form, "next"), "/dead-letters")
        verb, ids, everything = _form_selection(form)
        by = f"dashboard@{request.client.host if request.client else 'unknown'}"
        if verb == "requeue":
            count = await run_in_threadpool(app.broker.requeue_dead, ids, None, everything, by=by)
            done = f"Requeued {_plural(count)}."
        else:
            count = await run_in_threadpool(app.broker.discard_dead, ids, None, everything)
            done = f"Discarded {_plural(count)}."
        separator = "&" if "?" in back else "?"
        return RedirectResponse(back + separator + urlencode({"done": done}), status_code=303)

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
        if security.token is None:
            return RedirectResponse("/", status_code=303)
        form = await _form(request)
        target = local_path(_field(form, "next"))
        if not security.token_ok(_field(form, "token")):
            return render(request, "login.html", "login", None, status=401, next=target, error=True)
        response = RedirectResponse(target, status_code=303)
        assert security.session is not None
        response.set_cookie(
            COOKIE,
            security.session,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        form = await _form(request)
        if not security.csrf_ok(_field(form, "csrf")):
            return PlainTextResponse("the form has expired: reload the page", status_code=403)
        response = RedirectResponse("/login" if security.token else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
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
        return JSON(
            data.dead_letters(
                app,
                params.get("task") or None,
                params.get("queue") or None,
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

    async def api_requeue(request: Request) -> Response:
        ids, task_name, everything = data.selection(await _json_body(request))
        by = f"dashboard@{request.client.host if request.client else 'unknown'}"
        count = await run_in_threadpool(app.broker.requeue_dead, ids, task_name, everything, by=by)
        return JSON({"requeued": count})

    async def api_discard(request: Request) -> Response:
        ids, task_name, everything = data.selection(await _json_body(request))
        count = await run_in_threadpool(app.broker.discard_dead, ids, task_name, everything)
        return JSON({"discarded": count})

    # -- errors ---------------------------------------------------------------------------------

    def bad_request(request: Request, exc: Exception) -> Response:
        if _is_api(request):
            return JSON({"error": str(exc)}, status_code=400)
        return render(request, "error.html", "error", None, status=400, message=str(exc))

    def unavailable(request: Request, exc: Exception) -> Response:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = f"cannot reach the database: {first}"
        if _is_api(request):
            return JSON({"error": message}, status_code=503)
        return render(request, "error.html", "error", None, status=503, message=message)

    def no_schema(request: Request, exc: Exception) -> Response:
        message = "the pgtasks schema does not exist in this database; run `pgtasks migrate`"
        if _is_api(request):
            return JSON({"error": message}, status_code=503)
        return render(request, "error.html", "error", None, status=503, message=message)

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
        psycopg.OperationalError: unavailable,
        psycopg.errors.UndefinedTable: no_schema,
    }
    starlette = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, security=security)],
        exception_handlers=handlers,
    )
    starlette.state.celery_app = celery_app
    starlette.state.security = security
    return starlette


# -- request bodies -----------------------------------------------------------------------------


Form = dict[str, list[str]]
#: The largest form body read (the dead-letters form with a page of checked rows is far less).
MAX_FORM_BYTES = 1 << 20


async def _form(request: Request) -> Form:
    """The request's url-encoded form (what the dashboard's own forms send)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise BadRequest("send the form url-encoded")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FORM_BYTES:
            raise BadRequest("the form is too large")
    try:
        return parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=10_000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the form cannot be read: {exc}") from None


def _field(form: Form, name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def _plural(n: int) -> str:
    return f"{n} dead letter" if n == 1 else f"{n} dead letters"


def _form_selection(form: Form) -> tuple[str, list[str] | None, bool]:
    """What the dead-letters form asks: a row's own button (``requeue_one``/``discard_one``
    holding its id), or ``action`` on the checked ``ids`` or on ``all`` of them."""
    for verb in ("requeue", "discard"):
        one = _field(form, f"{verb}_one")
        if one:
            return verb, [one], False
    action = _field(form, "action") or ""
    verb, _, scope = action.partition("_")
    if verb not in ("requeue", "discard") or scope not in ("selected", "all"):
        raise BadRequest("unknown action")
    if scope == "all":
        return verb, None, True
    ids = [v for v in form.get("ids", []) if v]
    if not ids:
        raise BadRequest("no dead letter selected")
    return verb, ids, False


async def _json_body(request: Request) -> Any:
    """The request's JSON body. A browser can send JSON to another site only after asking that
    site first (CORS), which this one never allows, so the content type is required."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest("send a JSON body with Content-Type: application/json")
    raw = await request.body()
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
