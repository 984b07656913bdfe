"""``pgtasks upgrade imports PATH``: rewrite a project's ``celery`` imports to ``pgtasks``.

The files are parsed with libcst, so only import statements and the names bound by
``import celery`` change: strings, comments, formatting, relative imports (``from .celery
import app``) and other names (``celery_app``, ``my_celery``, a parameter called ``celery``)
stay as they are. Prints a unified diff; ``--write`` changes the files in place.

libcst is an optional dependency: ``pip install 'pgtasks[upgrade]'``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from pgtasks.cli.main import cli

OLD = "celery"
NEW = "pgtasks"

# Celery modules whose pgtasks counterpart lives elsewhere; every other ``celery.x`` maps to
# ``pgtasks.x``. Only ``from`` imports and aliased imports use this table: a plain
# ``import celery.app.task`` keeps its dotted shape so the attribute chains that use it stay
# consistent.
MODULE_MAP = {
    "celery.app.task": "pgtasks.task",
    "celery.app.base": "pgtasks.app",
    "celery.local": "pgtasks.app",
}

# Names that import fine but behave differently, with what to check.
DIFFERENCES = {
    ("pgtasks", "current_app"): "`current_app` is a function in pgtasks: call it, current_app()",
}

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".tox",
        ".nox",
        ".venv",
        "venv",
        "env",
        "node_modules",
        "__pycache__",
        "build",
        "dist",
        "site-packages",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
    }
)


def _libcst() -> Any:
    try:
        import libcst
    except ImportError:
        raise click.ClickException(
            "`pgtasks upgrade imports` needs libcst: pip install 'pgtasks[upgrade]' "
            "(or pip install 'libcst>=1.1')"
        ) from None
    return libcst


def _is_celery(module: str) -> bool:
    return module == OLD or module.startswith(OLD + ".")


def target_module(module: str, *, keep_shape: bool = False) -> str:
    """The pgtasks module standing for Celery's ``module``."""
    if not keep_shape:
        for old, new in MODULE_MAP.items():
            if module == old or module.startswith(old + "."):
                return new + module[len(old) :]
    return NEW + module[len(OLD) :]


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _name_exists(module: str, name: str) -> bool:
    if _module_exists(f"{module}.{name}"):
        return True
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return hasattr(mod, name)


@dataclass
class Rewrite:
    """The outcome of rewriting one file."""

    path: Path
    old: str
    new: str
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def diff(self) -> str:
        """A unified diff of the change (empty when nothing changed)."""
        name = self.path.as_posix()
        # git's a/ b/ prefixes for relative paths, so `git apply` takes the diff as it is.
        old, new = (name, name) if self.path.is_absolute() else (f"a/{name}", f"b/{name}")
        return "".join(
            difflib.unified_diff(
                self.old.splitlines(keepends=True),
                self.new.splitlines(keepends=True),
                fromfile=old,
                tofile=new,
            )
        )


def _dotted(node: Any) -> str:
    """``a.b.c`` for a Name/Attribute chain."""
    cst = _libcst()
    if isinstance(node, cst.Name):
        return str(node.value)
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    raise TypeError(f"not a dotted name: {node!r}")


def _dotted_node(name: str) -> Any:
    cst = _libcst()
    parts = name.split(".")
    node: Any = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _root_name(node: Any) -> Any:
    cst = _libcst()
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def rewrite_source(source: str, path: Path | str = "<string>") -> Rewrite:
    """Rewrite the ``celery`` imports in ``source``; raises ``libcst.ParserSyntaxError`` when
    the file does not parse."""
    _libcst()
    import libcst as cst
    from libcst import metadata

    module = cst.parse_module(source)
    wrapper = metadata.MetadataWrapper(module)
    scopes = wrapper.resolve(metadata.ScopeProvider)
    positions = wrapper.resolve(metadata.PositionProvider)
    notes: list[str] = []

    # The Name nodes that refer to a module bound by ``import celery[.x]`` (without ``as``).
    rename: set[Any] = set()
    for scope in {s for s in scopes.values() if s is not None}:
        for assignment in scope.assignments:
            if not isinstance(assignment, metadata.ImportAssignment):
                continue
            node = assignment.node
            if not isinstance(node, cst.Import):
                continue
            bound = [
                alias
                for alias in node.names
                if alias.asname is None and _is_celery(_dotted(alias.name))
            ]
            if not bound:
                continue
            for access in assignment.references:
                root = _root_name(access.node)
                if root is None or root.value != OLD:
                    continue
                # Resolve the bare name where it is used: a parameter or local called
                # ``celery`` shadows the module even when a dotted import matched the access.
                use_scope = scopes.get(root)
                bindings = list(use_scope[OLD]) if use_scope is not None else []
                imports = [b for b in bindings if isinstance(b, metadata.ImportAssignment)]
                if not imports:
                    continue
                if len(imports) != len(bindings):
                    line = positions[root].start.line
                    notes.append(
                        f"{path}:{line}: `{OLD}` is both an imported module and another value "
                        "here; left as is, check it by hand"
                    )
                    continue
                rename.add(root)

    class Transformer(cst.CSTTransformer):
        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
            if original_node in rename:
                return updated_node.with_changes(value=NEW)
            return updated_node

        def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
            names = []
            for orig_alias, alias in zip(original_node.names, updated_node.names, strict=True):
                dotted = _dotted(orig_alias.name)
                if _is_celery(dotted):
                    new = target_module(dotted, keep_shape=alias.asname is None)
                    self._check(new, None, orig_alias)
                    alias = alias.with_changes(name=_dotted_node(new))
                names.append(alias)
            return updated_node.with_changes(names=names)

        def leave_ImportFrom(
            self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
        ) -> cst.ImportFrom:
            if original_node.relative or original_node.module is None:
                return updated_node
            dotted = _dotted(original_node.module)
            if not _is_celery(dotted):
                return updated_node
            new = target_module(dotted)
            if not isinstance(original_node.names, cst.ImportStar):
                for alias in original_node.names:
                    self._check(new, _dotted(alias.name), alias)
            return updated_node.with_changes(module=_dotted_node(new))

        def _check(self, module: str, name: str | None, node: Any) -> None:
            line = positions[node].start.line
            if not _module_exists(module):
                notes.append(f"{path}:{line}: pgtasks has no module {module!r} yet")
            elif name is not None and not _name_exists(module, name):
                notes.append(f"{path}:{line}: pgtasks has no {name!r} in {module!r} yet")
            elif name is not None and (module, name) in DIFFERENCES:
                notes.append(f"{path}:{line}: {DIFFERENCES[module, name]}")

    new_module = wrapper.visit(Transformer())
    return Rewrite(Path(path), source, new_module.code, notes)


def python_files(paths: Sequence[Path]) -> Iterator[Path]:
    """The ``.py`` files under ``paths``, skipping virtualenvs, VCS and build directories."""
    for root in paths:
        if root.is_file():
            yield root
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(
                d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
            )
            for filename in sorted(filenames):
                if filename.endswith((".py", ".pyi")):
                    yield Path(dirpath) / filename


@cli.group()
def upgrade() -> None:
    """Move a Celery project to pgtasks."""


@upgrade.command("imports")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--write", is_flag=True, help="Change the files in place (default: print a diff).")
@click.option("--check", is_flag=True, help="Exit with status 1 when any file would change.")
@click.option("-q", "--quiet", is_flag=True, help="No diff; only the summary.")
def imports(paths: tuple[Path, ...], write: bool, check: bool, quiet: bool) -> None:
    """Rewrite `celery` imports to `pgtasks` in the Python files under PATHS.

    \b
    import celery                       -> import pgtasks   (and celery.x.y uses)
    import celery as c                  -> import pgtasks as c
    from celery import Celery           -> from pgtasks import Celery
    from celery.schedules import crontab -> from pgtasks.schedules import crontab

    Strings, comments, relative imports and other names are left alone. Files that do not
    parse are reported and skipped.
    """
    cst = _libcst()
    changed: list[Path] = []
    errors = 0
    for path in python_files(list(paths)):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            click.echo(f"error: {path}: cannot read: {exc.strerror}", err=True)
            errors += 1
            continue
        if OLD.encode() not in raw:
            continue
        try:
            source = raw.decode(_encoding(raw))
            result = rewrite_source(source, path)
        except (UnicodeDecodeError, LookupError) as exc:
            click.echo(f"error: {path}: cannot decode: {exc}", err=True)
            errors += 1
            continue
        except cst.ParserSyntaxError as exc:
            first = str(exc).strip().splitlines()[0]
            click.echo(
                f"error: {path}:{exc.raw_line}:{exc.raw_column}: cannot parse, skipped: {first}",
                err=True,
            )
            errors += 1
            continue
        for note in result.notes:
            click.echo(f"note: {note}", err=True)
        if not result.changed:
            continue
        changed.append(path)
        if not quiet and not write:
            click.echo(result.diff(), nl=False)
        if write:
            path.write_bytes(result.new.encode(_encoding(raw)))
    verb = "rewrote" if write else "would rewrite"
    summary = f"{verb} {len(changed)} file{'s' if len(changed) != 1 else ''}"
    if errors:
        summary += f"; {errors} file{'s' if errors != 1 else ''} could not be read or parsed"
    click.echo(summary, err=True)
    for path in changed if write else ():
        click.echo(f"  {path}", err=True)
    if errors or (check and changed and not write):
        sys.exit(1)


def _encoding(raw: bytes) -> str:
    """The file's source encoding (PEP 263 cookie, else UTF-8)."""
    import io
    import tokenize

    try:
        return tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
    except SyntaxError:
        return "utf-8"
