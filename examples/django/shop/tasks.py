"""Tasks of the shop app, written with ``shared_task`` as reusable Django apps do."""

from __future__ import annotations

from django.db import connection

from pgtasks import shared_task


@shared_task
def send_receipt(order_id: int) -> str:
    """Uses Django's database connection inside the task, as real tasks do."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::int * 2", [order_id])
        (doubled,) = cursor.fetchone()
    return f"receipt for order {order_id} ({doubled})"
