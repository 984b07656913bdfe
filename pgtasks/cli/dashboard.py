"""``dashboard``: the web view of the queues, tasks, dead letters and periodic schedules."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click
from click.core import ParameterSource

from pgtasks.cli.main import cli, get_app

MISSING = (
    "the dashboard needs starlette, jinja2 and uvicorn ({missing} is missing): "
    "pip install 'pgtasks[dashboard]'"
)
#: Kept in step with pgtasks.dashboard.security, which needs starlette to import.
MAKE_TOKEN = """python -c "import secrets; print(secrets.token_urlsafe(32))\""""


def _read_token_file(path: Path) -> str:
    """The token in ``path``: its text without the line end and surrounding spaces."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--token-file") from None
    token = text.strip()
    if not token:
        raise click.BadParameter(
            f"{path} is empty; write a token into it, e.g. {MAKE_TOKEN} > {path}",
            param_hint="--token-file",
        )
    if os.name == "posix":
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            click.secho(
                f"warning: {path} can be read by other users of this machine "
                f"(mode {stat.filemode(mode)}); chmod 600 {path}",
                fg="yellow",
                err=True,
            )
    return token


def _choose_token(ctx: click.Context, token: str | None, token_file: Path | None) -> str | None:
    """The token from exactly one of PGTASKS_DASHBOARD_TOKEN, --token-file and --token."""
    if token is not None and token_file is not None:
        given = (
            "--token"
            if ctx.get_parameter_source("token") is ParameterSource.COMMANDLINE
            else ("PGTASKS_DASHBOARD_TOKEN")
        )
        raise click.UsageError(f"give the token once: {given} or --token-file, not both")
    if token_file is not None:
        return _read_token_file(token_file)
    if token is not None and ctx.get_parameter_source("token") is ParameterSource.COMMANDLINE:
        click.secho(
            "warning: --token is visible to every user of this machine (ps, /proc); "
            "set PGTASKS_DASHBOARD_TOKEN or use --token-file instead",
            fg="yellow",
            err=True,
        )
    if token == "":
        raise click.BadParameter(
            f"the token is empty; make one with: {MAKE_TOKEN}", param_hint="--token"
        )
    return token


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
    help="Address to listen on; anything but loopback needs a token.",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="PGTASKS_DASHBOARD_TOKEN_FILE",
    show_envvar=True,
    metavar="PATH",
    help=(
        "Read the token from this file, which holds it alone (a line end after it is fine; "
        "keep it chmod 600)."
    ),
)
@click.option(
    "--token",
    envvar="PGTASKS_DASHBOARD_TOKEN",
    show_envvar=True,
    metavar="TOKEN",
    help=(
        "The token itself. Prefer the environment variable or --token-file: a command "
        "line is visible to every user of the machine."
    ),
)
@click.option(
    "--forwarded-allow-ips",
    envvar="PGTASKS_DASHBOARD_FORWARDED_ALLOW_IPS",
    show_envvar=True,
    default="127.0.0.1,::1",
    show_default=True,
    metavar="IPS",
    help=(
        "Proxies (comma-separated addresses or networks, or '*') whose X-Forwarded-Proto "
        "and X-Forwarded-For are believed: which scheme and address the browser used."
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
    ctx: click.Context,
    port: int,
    address: str,
    token_file: Path | None,
    token: str | None,
    forwarded_allow_ips: str,
    loglevel: str,
) -> None:
    """Serve the dashboard: live workers, throughput, queues, tasks, dead letters (requeue,
    discard) and periodic schedules, with a JSON API under /api.

    With a token, every page and API call needs it: API clients send 'Authorization: Bearer
    TOKEN', browsers log in once (an HttpOnly session cookie, ended by logging out). The token
    must be at least 16 characters; make one with:

    \b
      python -c "import secrets; print(secrets.token_urlsafe(32))"

    Without a token the dashboard is read-only (nothing can be requeued, discarded or
    enqueued) and listens only on a loopback address.

    Behind a TLS proxy, set --forwarded-allow-ips to the proxy's address so that the session
    cookie is marked Secure (the proxy must send X-Forwarded-Proto).

    \b
    Examples:
      pgtasks -A proj dashboard                       # read-only, http://127.0.0.1:5555
      export PGTASKS_DASHBOARD_TOKEN="$(cat /run/secrets/dashboard)"
      pgtasks -A proj dashboard --address 0.0.0.0
      pgtasks -A proj dashboard --token-file /run/secrets/dashboard --forwarded-allow-ips 10.0.0.2
      curl -H "Authorization: Bearer $PGTASKS_DASHBOARD_TOKEN" http://HOST:5555/api/queues
    """
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise click.ClickException(MISSING.format(missing=exc.name or "a package")) from None
    from pgtasks.dashboard import UnsafeBind, WeakToken, check_bind, check_token, create_app
    from pgtasks.dashboard.security import READ_ONLY, TrustedProxies

    token = _choose_token(ctx, token, token_file)
    if token is not None:
        try:
            check_token(token)
        except WeakToken as exc:
            raise click.UsageError(str(exc)) from None
    try:
        TrustedProxies(forwarded_allow_ips)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--forwarded-allow-ips") from None
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
    web = create_app(app, token=token, forwarded_allow_ips=forwarded_allow_ips)
    host = f"[{address}]" if ":" in address else address
    click.echo(f"pgtasks dashboard on http://{host}:{port}/", err=True)
    if token is None:
        click.secho(
            f"READ-ONLY: {READ_ONLY}\nMake a token with: {MAKE_TOKEN}",
            fg="yellow",
            bold=True,
            err=True,
        )
    else:
        click.echo("Every page and API call needs the token.", err=True)
    uvicorn.run(
        web,
        host=address,
        port=port,
        log_level=loglevel.lower(),
        proxy_headers=False,  # the app reads forwarded headers itself, from trusted proxies
        server_header=False,
    )
