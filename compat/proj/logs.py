"""Task logging with ``get_task_logger``."""

from celery.utils.log import get_task_logger

from proj.celery import app

logger = get_task_logger(__name__)


@app.task
def log_something(message):
    logger.info("handling %s", message)
    return {"logger": logger.name, "message": message}
