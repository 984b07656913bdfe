"""pgtasks application used by the shared benchmark harness (/work/shared/bench).

Workers start it with ``python -m pgtasks -A pgtasks_app worker ...``; the adapter's ``env()``
puts this folder and the harness folder (for ``common``) on ``PYTHONPATH`` and sets
``PGTASKS_DATABASE_URL`` to the harness's database, which wins over the URL given here.
"""

import common  # the harness's module: database address and the completion sink

from pgtasks import Celery

DB = "bench_pgtasks"
TASK_NAME = "bench.task"

app = Celery("benchpgtasks", broker=common.dsn(DB))


# No result is stored, as the harness's Celery app runs with task_ignore_result=True and no
# result backend: the sink counts completions. The attempt history is still written.
@app.task(name=TASK_NAME, ignore_result=True)
def bench_task(run: str, ts: float) -> None:
    common.task_body(run, ts)
