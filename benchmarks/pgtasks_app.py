"""pgtasks application used by the shared benchmark harness (/work/shared/bench).

Workers start it with ``python -m pgtasks -A pgtasks_app worker ...``; the adapter's ``env()``
puts this folder and the harness folder (for ``common``) on ``PYTHONPATH`` and sets
``PGTASKS_DATABASE_URL`` to the harness's database, which wins over the URL given here.
"""

import itertools
import os

import common  # the harness's module: database address and the completion sink

from pgtasks import Celery

DB = "bench_pgtasks"
TASK_NAME = "bench.task"

app = Celery("benchpgtasks", broker=common.dsn(DB))


# No result is stored, as the harness's Celery app runs with task_ignore_result=True and no
# result backend: the sink counts completions. The attempt history is still written.
if os.environ.get("PGTASKS_BENCH_ASYNC"):
    # Workers of the asyncio pool run the task as a coroutine, as the async peers' adapters
    # do (its body, the harness's Redis call, is the same blocking call theirs make).

    @app.task(name=TASK_NAME, ignore_result=True)
    async def bench_task(run: str, ts: float) -> None:
        common.task_body(run, ts)

else:

    @app.task(name=TASK_NAME, ignore_result=True)
    def bench_task(run: str, ts: float) -> None:
        common.task_body(run, ts)


# Concurrency limits under load (PGTASKS_BENCH_LIMITS, read by the adapter's bulk enqueue):
# "keys:K:L" sends the tasks as bench.limited, spread over K concurrency keys of limit L each,
# so every claim and completion goes through the limit counts; "backlog:B" puts B tasks of one
# full key in front of the plain ones, to show that they cost the others nothing once blocked;
# "rated:B" puts B tasks of a task limited to one start an hour in front of them.
_turn = itertools.count()
_keys = int(os.environ.get("PGTASKS_BENCH_LIMIT_KEYS", "1000"))


def _spread(run: str, ts: float) -> str:
    return f"k{next(_turn) % _keys}"


@app.task(name="bench.limited", ignore_result=True, concurrency_limit=1, concurrency_key=_spread)
def bench_limited(run: str, ts: float) -> None:
    common.task_body(run, ts)


@app.task(name="bench.held", ignore_result=True, concurrency_limit=1, concurrency_key=("run",))
def bench_held(run: str) -> None:
    common.task_body(run, 0.0)


@app.task(name="bench.rated", ignore_result=True, rate_limit="1/h")
def bench_rated(run: str) -> None:
    common.task_body(run, 0.0)
