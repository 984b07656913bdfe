"""Enqueue from FastAPI endpoints and await results without blocking the event loop.

    pgtasks -A examples.fastapi.app worker -P asyncio -l INFO    # in one shell
    uvicorn examples.fastapi.app:api                             # in another
    curl -X POST 'localhost:8000/add?a=2&b=3'                    # {"id": "...", "result": 5}
    curl -X POST 'localhost:8000/reports/eu'                     # {"id": "..."}, one at a time

``python -m examples.fastapi.run`` does the same in one process, with a test client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from pgtasks import Celery

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("fastapi-example")


# async def tasks run on every pool; sync and async tasks share one app.
@app.task
async def add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)  # an awaited call to some service
    return a + b


@app.task(unique_on=("region",))
def build_report(region: str) -> str:
    return f"report for {region}"


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    yield
    await app.close_async()  # the async pool of this event loop


api = FastAPI(lifespan=lifespan)


@api.post("/add")
async def enqueue_add(a: int, b: int, wait: float = 10.0) -> dict[str, Any]:
    result = await add.delay_async(a, b)
    return {"id": result.id, "result": await result.get_async(timeout=wait)}


@api.post("/reports/{region}")
async def enqueue_report(region: str) -> dict[str, Any]:
    # A second click while one is waiting or running gets that one's id back.
    result = await build_report.delay_async(region)
    return {"id": result.id}
