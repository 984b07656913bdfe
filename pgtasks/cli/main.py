"""``pgtasks [-A APP] COMMAND``: the command group and how ``-A`` finds the app."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click
import psycopg

from pgtasks.exceptions import ImproperlyConfigured, PgTasksError


def find_app(spec: str) -> Any:
    """Celery's ``-A`` rules: ``pkg.mod:attr``, ``pkg.mod.attr``, or a module holding ``app``
    or ``celery`` (also its ``celery`` submodule)."""
    from pgtasks.app import Celery

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name or "." not in module_name:
            raise click.UsageError(f"cannot import app module {module_name!r}: {exc}") from None
        parent, _, attr = module_name.rpartition(".")
        module = importlib.import_module(parent)
    if attr:
        found = getattr(module, attr, None)
        if found is None:
            raise click.UsageError(f"module {module.__name__!r} has no attribute {attr!r}")
        return found
    for name in ("app", "celery"):
        candidate = getattr(module, name, None)
        if isinstance(candidate, Celery):
            return candidate
    for value in vars(module).values():
        if isinstance(value, Celery):
            return value
    try:
        sub = importlib.import_module(f"{module_name}.celery")
    except ModuleNotFoundError:
        sub = None
    if sub is not None:
        for name in ("app", "celery"):
            candidate = getattr(sub, name, None)
            if isinstance(candidate, Celery):
                return candidate
    raise click.UsageError(
        f"no pgtasks app found in {spec!r}: define `app = Celery(...)` there or pass -A module:attr"
    )


class AppGroup(click.Group):
    """Turns pgtasks' and psycopg's errors into one readable line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (PgTasksError, ImproperlyConfigured) as exc:
            raise click.ClickException(str(exc)) from None
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise click.ClickException(
                f"cannot reach the database: {first}. Check PGTASKS_DATABASE_URL (or the app's "
                "broker URL) and that PostgreSQL is running."
            ) from None


@click.group(cls=AppGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-A",
    "--app",
    "app_spec",
    envvar="PGTASKS_APP",
    metavar="MODULE",
    help="The app: module, module:attribute or package (also PGTASKS_APP).",
)
@click.option(
    "-b",
    "--broker",
    metavar="URL",
    help="Database URL (overrides the app's; PGTASKS_DATABASE_URL still wins).",
)
@click.option("--workdir", hidden=True, help="Change to this directory first (Celery's).")
@click.option("--config", "config_module", hidden=True, help="Settings module (Celery's).")
@click.option("-q", "--quiet", is_flag=True, hidden=True)
@click.option("--result-backend", hidden=True)  # results live in the same database
@click.option("--loader", hidden=True)
@click.option("-C", "--no-color", is_flag=True, hidden=True)
@click.option("--skip-checks", is_flag=True, hidden=True)
@click.version_option(package_name="pgtasks")
@click.pass_context
def cli(
    ctx: click.Context,
    /,
    app_spec: str | None,
    broker: str | None,
    workdir: str | None,
    config_module: str | None,
    quiet: bool,
    **_celery_globals: Any,
) -> None:
    """pgtasks: Celery's API on PostgreSQL, no broker.

    \b
    Examples:
      pgtasks -A proj migrate
      pgtasks -A proj worker -c 4 -Q celery,io -l INFO
      pgtasks -A proj purge -f
    """
    ctx.ensure_object(dict)
    ctx.obj["app_spec"] = app_spec
    ctx.obj["broker"] = broker
    ctx.obj["config_module"] = config_module
    ctx.obj["quiet"] = quiet
    if workdir:
        try:
            os.chdir(workdir)
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--workdir") from None


def get_app(ctx: click.Context, required: bool = True) -> Any:
    """The app named by -A (or a bare one when none is named and ``required`` is False)."""
    from pgtasks.app import Celery

    spec = ctx.obj.get("app_spec")
    if spec:
        app = find_app(spec)
    elif required:
        raise click.UsageError("no app given: pass -A MODULE (or set PGTASKS_APP)")
    else:
        app = Celery("pgtasks", set_as_current=False)
    if ctx.obj.get("config_module"):
        app.config_from_object(ctx.obj["config_module"])
    if ctx.obj.get("broker"):
        app.conf["broker_url"] = ctx.obj["broker"]
    return app


def main() -> None:
    """Console entry point."""
    from pgtasks.cli import beat, bench, commands, control, dashboard, ops, upgrade  # noqa: F401 - registers the commands

    cli(prog_name="pgtasks")
