"""``dashboard``: the web view of the queues, tasks, dead letters and periodic schedules."""

from __future__ import annotations

import click

from pgtasks.cli.main import cli, get_app

MISSING = (
    "the dashboard needs starlette, jinja2 and uvicorn ({missing} is missing): "
    "pip install 'pgtasks[dashboard]'"
)


@cli.command()
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=5555,
    show_default=True,
    help="Port to listen on.",
)
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback needs --token.",
)
@click.option(
    "--token",
    envvar="PGTASKS_DASHBOARD_TOKEN",
    metavar="TOKEN",
    help=(
        "Require this token on every page and API call (also PGTASKS_DASHBOARD_TOKEN): "
        "'Authorization: Bearer TOKEN', or the login form in a browser."
    ),
)
@click.option(
    "-l",
    "--loglevel",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Log level of the web server.",
)
@click.pass_context
def dashboard(
    ctx: click.Context, port: int, address: str, token: str | None, loglevel: str
) -> None:
    """Serve the dashboard: live workers, throughput, queues, tasks, dead letters (requeue,
    discard) and periodic schedules, with a JSON API under /api.

    Without a token it listens only on a loopback address, and only this machine may requeue,
    discard or enqueue. With --token, every page and API call needs the token: API clients
    send 'Authorization: Bearer TOKEN', browsers log in once (an HttpOnly cookie).

    \b
    Examples:
      pgtasks -A proj dashboard                       # http://127.0.0.1:5555
      pgtasks -A proj dashboard --port 8080
      PGTASKS_DASHBOARD_TOKEN=s3cret pgtasks -A proj dashboard --address 0.0.0.0
      curl -H 'Authorization: Bearer s3cret' http://HOST:5555/api/queues
    """
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise click.ClickException(MISSING.format(missing=exc.name or "a package")) from None
    from pgtasks.dashboard import UnsafeBind, check_bind, create_app

    try:
        check_bind(address, token)
    except UnsafeBind as exc:
        raise click.UsageError(str(exc)) from None
    app = get_app(ctx, required=False)
    version = app.broker.schema_version()
    if version is None:
        raise click.ClickException(
            "the pgtasks schema does not exist in this database; run `pgtasks migrate`"
        )
    web = create_app(app, token=token)
    host = f"[{address}]" if ":" in address else address
    click.echo(
        f"pgtasks dashboard on http://{host}:{port}/"
        + (" (token required)" if token else " (no token: this machine only)"),
        err=True,
    )
    uvicorn.run(
        web,
        host=address,
        port=port,
        log_level=loglevel.lower(),
        proxy_headers=False,
        server_header=False,
    )
