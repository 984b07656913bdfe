"""The command line, run as users run it: ``celery -A proj ...`` or ``pgtasks -A proj ...``
(``python -m <impl>``) against the running workers, its output and exit status recorded as
printed, with the host name and task ids made neutral."""

import ast
import os
import socket
import subprocess
import sys

from scenarios import WAIT, _text, scenario

#: The main worker, as the harness names it (``-n main@%h``).
MAIN = f"main@{socket.gethostname()}"


def raw(*args):
    """``<impl> -A proj <args>`` as run: its exit status, stdout and stderr."""
    cmd = [sys.executable, "-m", os.environ["COMPAT_IMPL"], "-A", "proj", *args]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=WAIT * 2, env=os.environ, check=False
    )
    return done.returncode, done.stdout, done.stderr


def run(*args):
    """The same, as recorded (see ``record``)."""
    return record(*raw(*args))


def record(code, out, err):
    """A run as recorded: ``{exit, stdout, error}`` (``error``: the last line on stderr,
    where the command says why it failed), the host name and ids made neutral."""
    lines = err.strip().splitlines()
    recorded = {"exit": code, "stdout": _neutral(out)}
    if code:
        recorded["error"] = _neutral(lines[-1] if lines else "")
    return recorded


def _neutral(text):
    return _text(text.replace(socket.gethostname(), "<host>"))


@scenario(
    "command line",
    note="`status` and `inspect ping` aimed at the main worker with `-d`, and at a worker "
    "that does not exist; stdout and the exit status are compared as printed.",
)
def cli_status_and_ping(obs):
    """``status`` and ``inspect ping`` print each replying worker and the count, and exit 69
    (EX_UNAVAILABLE) when none replies."""
    obs["status"] = run("status", "-d", MAIN)
    obs["ping"] = run("inspect", "ping", "-d", MAIN)
    obs["status_nobody"] = run("status", "-d", "nobody@nowhere", "--timeout", "0.5")
    obs["ping_nobody"] = run("inspect", "ping", "-d", "nobody@nowhere", "--timeout", "0.5")


@scenario(
    "command line",
    note="`call` prints the new task's id; `result` waits for it and prints its value.",
)
def cli_call_and_result(obs):
    """``call proj.tasks.add --args '[2, 3]'`` enqueues the task and prints its id; ``result``
    with that id prints 5."""
    called = raw("call", "proj.tasks.add", "--args", "[2, 3]")
    obs["call"] = record(*called)
    obs["result"] = run("result", called[1].strip())
    called = raw("call", "proj.tasks.add", "--kwargs", '{"x": 1, "y": 1}')
    obs["call_kwargs"] = record(*called)
    obs["result_kwargs"] = run("result", called[1].strip())


@scenario(
    "command line",
    note="`inspect registered` for the main worker: the task names it prints, as printed.",
)
def cli_inspect_registered(obs):
    """``inspect registered -d main@<host>`` lists the worker's tasks, one per line."""
    obs["registered"] = run("inspect", "registered", "-d", MAIN)


@scenario(
    "command line",
    differs={
        "args": "pgtasks shows a call's arguments as its argsrepr (redacted where the "
        "task says so), as Celery's inspect does with safe=True: the command reads every "
        "task's row from the database, and a secret in an argument should not reach it "
        "(see docs/operating.md)",
    },
    note="`inspect active` while a task of the main worker sleeps: the line for that task "
    "(other scenarios' tasks may run beside it), read back as the dict it prints; its keys, "
    "and the values that do not depend on timing or the process.",
)
def cli_inspect_active(obs):
    """``inspect active -d main@<host>`` lists the running task as a dict: id, name, args,
    kwargs, type, hostname, ..."""
    from proj.tasks import sleep_then
    from scenarios import wait_state

    sent = sleep_then.apply_async((3, "done"))
    obs["started"] = wait_state(sent, {"STARTED"})
    code, out, _ = raw("inspect", "active", "-d", MAIN)
    lines = out.splitlines()
    obs["header"] = _neutral(lines[0]) if lines else None
    mine = [line for line in lines if sent.id in line]
    obs["found"] = len(mine)
    if mine:
        prefix, _, shown = mine[0].partition("* ")
        obs["indent"] = prefix
        task = ast.literal_eval(shown)
        obs["keys"] = sorted(task)
        obs["shown"] = {
            key: _neutral(str(task[key]))
            for key in ("name", "kwargs", "type", "hostname")
            if key in task
        }
        obs["args"] = _neutral(str(task.get("args")))
    obs["exit"] = code
    obs["result"] = sent.get(timeout=WAIT)
