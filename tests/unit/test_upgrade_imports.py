"""``pgtasks upgrade imports``: celery imports rewritten by a parser, nothing else touched."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgtasks.cli.main import cli
from pgtasks.cli.upgrade import rewrite_source

pytest.importorskip("libcst")

PROJECT = {
    "proj/__init__.py": "from .celery import app as celery_app\n\n__all__ = ('celery_app',)\n",
    "proj/celery.py": """\
        import os

        from celery import Celery
        from celery.schedules import crontab

        app = Celery("proj")  # the celery app
        app.conf.beat_schedule = {"tick": {"task": "proj.tasks.tick", "schedule": crontab()}}
        """,
    "proj/tasks.py": """\
        import celery
        import celery.result
        import celery as c
        from celery import shared_task
        from celery.exceptions import SoftTimeLimitExceeded, Retry
        from celery.utils.log import get_task_logger

        logger = get_task_logger(__name__)
        my_celery = "celery"
        celery_app = None


        def lookup(task_id, celery=None):
            # celery here is a parameter, not the module
            return celery.result.AsyncResult(task_id), c.current_app, celery_app


        @shared_task
        def tick():
            return celery.result.AsyncResult("x"), obj.celery
        """,
    "proj/unrelated.py": "VALUE = 1\n",
}


def make_project(tmp_path: Path) -> Path:
    for name, text in PROJECT.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "proj"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["upgrade", "imports", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_rewrites_imports_and_module_uses_only() -> None:
    source = textwrap.dedent(PROJECT["proj/tasks.py"])
    new = rewrite_source(source, "tasks.py").new
    assert "import pgtasks\n" in new
    assert "import pgtasks.result\n" in new
    assert "import pgtasks as c\n" in new
    assert "from pgtasks import shared_task\n" in new
    assert "from pgtasks.exceptions import SoftTimeLimitExceeded, Retry\n" in new
    assert "from pgtasks.utils.log import get_task_logger\n" in new
    assert 'return pgtasks.result.AsyncResult("x"), obj.celery' in new
    # A parameter called celery shadows the module: its uses are not the module's.
    assert "return celery.result.AsyncResult(task_id), c.current_app, celery_app" in new
    assert 'my_celery = "celery"' in new
    assert "# celery here is a parameter, not the module" in new
    assert "celery_app = None" in new


def test_relative_and_project_imports_are_left_alone() -> None:
    source = "from .celery import app\nfrom proj.celery import app as a\nimport celeryconfig\n"
    assert rewrite_source(source).new == source


def test_diff_by_default_then_write_then_idempotent(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    before = {p: p.read_text() for p in proj.rglob("*.py")}

    code, out, err = run(str(proj))
    assert code == 0
    assert f"--- {proj / 'tasks.py'}\n+++ {proj / 'tasks.py'}\n" in out
    assert "-from celery import Celery\n-from celery.schedules" in out
    assert "+from pgtasks import Celery\n+from pgtasks.schedules" in out
    assert "would rewrite 2 files" in err
    assert {p: p.read_text() for p in proj.rglob("*.py")} == before  # nothing written

    code, out, err = run("--write", str(proj))
    assert code == 0
    assert out == ""
    assert "rewrote 2 files" in err
    assert str(proj / "celery.py") in err and str(proj / "tasks.py") in err
    assert "from pgtasks.schedules import crontab" in (proj / "celery.py").read_text()
    assert (proj / "__init__.py").read_text() == before[proj / "__init__.py"]

    code, out, err = run("--write", str(proj))
    assert (code, out) == (0, "")
    assert "rewrote 0 files" in err


def test_check_exits_1_when_files_would_change(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    assert run("--check", "-q", str(proj))[0] == 1
    run("--write", str(proj))
    assert run("--check", "-q", str(proj))[0] == 0


def test_unparsable_file_is_reported_and_the_rest_rewritten(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    (proj / "broken.py").write_text("import celery\ndef broken(:\n")
    code, _, err = run("--write", str(proj))
    assert code == 1
    assert f"error: {proj / 'broken.py'}" in err
    assert "cannot parse" in err
    assert "rewrote 2 files; 1 file could not be read or parsed" in err
    assert (proj / "broken.py").read_text() == "import celery\ndef broken(:\n"
    assert "from pgtasks import shared_task" in (proj / "tasks.py").read_text()


def test_keeps_encoding_and_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "legacy.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\r\nimport celery\r\nNAME = '\xe9'\r\n")
    code, _, _ = run("--write", str(path))
    assert code == 0
    assert path.read_bytes() == b"# -*- coding: latin-1 -*-\r\nimport pgtasks\r\nNAME = '\xe9'\r\n"


def test_relative_paths_get_git_prefixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run("proj")
    assert code == 0
    assert "--- a/proj/tasks.py\n+++ b/proj/tasks.py\n" in out


def test_a_file_binding_celery_twice_is_flagged_not_guessed() -> None:
    source = "import celery\ncelery = celery.Celery()\n"
    result = rewrite_source(source, "odd.py")
    assert "celery = celery.Celery()" in result.new
    assert any("odd.py:2" in note and "check it by hand" in note for note in result.notes)


def test_notes_name_what_pgtasks_lacks_or_does_differently() -> None:
    source = "from celery import current_app, not_a_celery_name\nimport celery.bin.worker\n"
    notes = rewrite_source(source, "n.py").notes
    assert any("n.py:1" in n and "current_app()" in n for n in notes)
    assert any("n.py:1" in n and "'not_a_celery_name'" in n for n in notes)
    assert any("n.py:2" in n and "'pgtasks.bin.worker'" in n for n in notes)
