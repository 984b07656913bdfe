"""``run``: materialise the project for one implementation, start its workers, run every
scenario in its own bounded subprocess, stop the workers, write the observations as JSON.

The project (``proj/``) and the scenarios (``scenarios/``) are written against Celery. For
pgtasks they are copied with every ``from celery…`` / ``import celery…`` line renamed to
pgtasks, exactly the one-line change a migrating team makes; nothing else differs but the
worker command.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
IMPLS = ("celery", "pgtasks")

REDIS_URL = os.environ.get("COMPAT_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_BROKER_DB, REDIS_RESULT_DB = 10, 11
PG_URL = os.environ.get("COMPAT_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_SCHEMA = os.environ.get("COMPAT_PG_SCHEMA", "pgtasks_compat")

MAIN_QUEUES = "celery,routed,explicit"
READY_TIMEOUT = 60.0
PARALLEL = 6

_IMPORT_LINE = re.compile(r"^(\s*)(from|import)(\s+)celery(?=[\s.])", re.M)


class HarnessError(RuntimeError):
    """The harness itself cannot run (not a scenario failure)."""


def rename_imports(source: str) -> str:
    """``from celery.x import y`` → ``from pgtasks.x import y``; nothing else is touched."""
    return _IMPORT_LINE.sub(r"\1\2\3pgtasks", source)


def materialise(impl: str, root: Path) -> int:
    """Copy proj/ and scenarios/ under ``root`` for ``impl``; returns the lines renamed."""
    renamed = 0
    for package in ("proj", "scenarios"):
        shutil.copytree(
            HERE / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
        if impl == "pgtasks":
            for path in (root / package).rglob("*.py"):
                text = path.read_text()
                renamed += len(_IMPORT_LINE.findall(text))
                path.write_text(rename_imports(text))
    return renamed


def worker_command(impl: str) -> list[str]:
    """``celery -A proj worker`` or ``pgtasks -A proj worker``, run by this interpreter."""
    cmd = [sys.executable, "-m", impl, "-A", "proj", "worker", "-l", "WARNING"]
    if impl == "celery":
        cmd += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return cmd


def reset_backend(impl: str, env: dict[str, str], cwd: Path) -> None:
    """Start from empty: flush Celery's Redis databases, or recreate pgtasks' schema."""
    if impl == "celery":
        import redis

        for db in (REDIS_BROKER_DB, REDIS_RESULT_DB):
            redis.Redis.from_url(f"{REDIS_URL}/{db}").flushdb()
        return
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(PG_SCHEMA)))
    done = subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", "proj", "migrate"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise HarnessError(f"pgtasks migrate failed: {done.stderr.strip() or done.stdout}")


def environment(impl: str, root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGTASKS_", "COMPAT_"))}
    env.update(
        # The materialised project first; an inherited PYTHONPATH (e.g. a checkout of the
        # implementation under test) after it.
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
        PYTHONDONTWRITEBYTECODE="1",
        COMPAT_IMPL=impl,
        COMPAT_JOURNAL=str(root / "journal.jsonl"),
        COMPAT_WORKER_CMD=json.dumps(worker_command(impl)),
    )
    if impl == "celery":
        env["COMPAT_BROKER_URL"] = f"{REDIS_URL}/{REDIS_BROKER_DB}"
        env["COMPAT_RESULT_BACKEND"] = f"{REDIS_URL}/{REDIS_RESULT_DB}"
    else:
        env["COMPAT_BROKER_URL"] = PG_URL
        env["PGTASKS_SCHEMA_NAME"] = PG_SCHEMA
    return env


_PREFLIGHT = """
import importlib, json, sys
from proj.celery import TASK_MODULES
out = {}
for name in TASK_MODULES:
    try:
        importlib.import_module(name)
        out[name] = None
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def preflight(env: dict[str, str], cwd: Path) -> dict[str, str | None]:
    """Which task modules import under this implementation (None) and why not (the error)."""
    done = subprocess.run(
        [sys.executable, "-c", _PREFLIGHT],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise HarnessError(f"the project does not import: {done.stderr.strip()[-2000:]}")
    result: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def list_scenarios(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "scenarios", "--list"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise HarnessError(f"cannot list scenarios: {done.stderr.strip()[-2000:]}")
    listed: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return listed


class Worker:
    """A worker subprocess in its own process group, logging to a file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.log = cwd / f"worker-{name}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)

    def stop(self, grace: float = 15.0) -> int | None:
        """Warm shutdown (SIGTERM) within ``grace`` seconds, else SIGKILL; returns the exit code."""
        self.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Pool children left behind by a worker that did not clean up.
        _signal_group(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def wait_ready(worker: Worker, queue: str, env: dict[str, str], cwd: Path) -> str | None:
    """None once the worker answers a ping on ``queue``; else why not."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not worker.alive():
            return f"worker {worker.name!r} exited with {worker.proc.returncode}: {worker.tail()}"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "scenarios", "--ping", queue],
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            break
        if done.returncode == 0:
            return None
        time.sleep(0.5)
    return f"worker {worker.name!r} did not answer a ping on {queue!r} in {READY_TIMEOUT:.0f}s"


def run_scenario(meta: dict[str, Any], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    name = meta["name"]
    out = cwd / "out" / f"{name}.json"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scenarios", name, str(out)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=meta["timeout"])
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return {
            "status": "timeout",
            "error": {"type": "Timeout", "message": f"no outcome after {meta['timeout']:.0f}s"},
            "seconds": round(time.monotonic() - started, 2),
        }
    if not out.exists():
        tail = "\n".join((output or "").strip().splitlines()[-5:])
        return {
            "status": "error",
            "error": {"type": "Crash", "message": f"exit {proc.returncode}: {tail}"},
            "seconds": round(time.monotonic() - started, 2),
        }
    record: dict[str, Any] = json.loads(out.read_text())
    record.pop("name", None)
    return record


LOCK_TIMEOUT = 600.0


@contextlib.contextmanager
def exclusive(impl: str) -> Any:
    """Runs of one implementation on one machine take turns: they share Celery's Redis databases
    or pgtasks' schema, which each run resets."""
    path = Path(tempfile.gettempdir()) / f"compat-{impl}.lock"
    with open(path, "w") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HarnessError(
                        f"another {impl} run held {path} for {LOCK_TIMEOUT:.0f}s"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run(impl: str, out: Path, keep: bool = False) -> dict[str, Any]:
    if impl not in IMPLS:
        raise HarnessError(f"--impl must be one of {', '.join(IMPLS)}")
    with exclusive(impl):
        return _run(impl, out, keep)


def _run(impl: str, out: Path, keep: bool) -> dict[str, Any]:
    began = time.monotonic()
    phases: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix=f"compat-{impl}-"))
    (root / "out").mkdir()
    workers: list[Worker] = []
    try:
        renamed = materialise(impl, root)
        env = environment(impl, root)
        try:
            reset_backend(impl, env, root)
        except HarnessError:
            raise
        except Exception as exc:
            where = REDIS_URL if impl == "celery" else PG_URL
            raise HarnessError(f"cannot reset {where}: {type(exc).__name__}: {exc}") from exc
        modules = preflight(env, root)
        env["COMPAT_INCLUDE"] = ",".join(m for m, err in modules.items() if err is None)
        listed = list_scenarios(env, root)
        base = worker_command(impl)
        workers.append(
            Worker(
                "main",
                [*base, "-P", "threads", "-c", "4", "-Q", MAIN_QUEUES, "-n", "main@%h", "-B"],
                env,
                root,
            )
        )
        workers.append(
            Worker(
                "limits",
                [*base, "-P", "prefork", "-c", "2", "-Q", "limits", "-n", "limits@%h"],
                env,
                root,
            )
        )
        phases["setup"] = time.monotonic()
        problems = {
            w.name: wait_ready(w, q, env, root)
            for w, q in zip(workers, ("celery", "limits"), strict=True)
        }
        if impl == "celery" and problems["main"]:
            raise HarnessError(f"the reference Celery worker did not start: {problems['main']}")
        phases["workers_ready"] = time.monotonic()
        with ThreadPoolExecutor(PARALLEL) as pool:
            outcomes = list(pool.map(lambda m: run_scenario(m, env, root), listed))
        phases["scenarios"] = time.monotonic()
        scenarios = {}
        for order, (meta, outcome) in enumerate(zip(listed, outcomes, strict=True)):
            info = {k: meta[k] for k in ("feature", "doc", "note", "differs")}
            info["order"] = order
            scenarios[meta["name"]] = {**info, **outcome}
    finally:
        for w in workers:
            w.terminate()
        exits = {w.name: w.stop() for w in workers}
        phases["stop"] = time.monotonic()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    report = {
        "impl": impl,
        "version": _version(impl),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - began, 1),
        "phase_seconds": _durations(began, phases),
        "renamed_import_lines": renamed,
        "modules": modules,
        "workers": {"problems": problems, "exit_codes": exits},
        "scenarios": scenarios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, sort_keys=True, default=repr) + "\n")
    return report


def _version(impl: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(impl)
    except PackageNotFoundError:
        return "unknown"


def _durations(began: float, marks: dict[str, float]) -> dict[str, float]:
    out, last = {}, began
    for name, at in marks.items():
        out[name] = round(at - last, 1)
        last = at
    return out
