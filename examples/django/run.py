"""Enqueue inside Django transactions and run a worker, without manage.py.

python -m examples.django.run
"""

from __future__ import annotations

import django
from django.db import transaction

from examples.django.proj import celery_app as app
from pgtasks.migrate import migrate
from pgtasks.worker import Worker


class Rollback(Exception):
    """Raised to roll an atomic() block back."""


def main() -> None:
    django.setup()
    migrate(app.database_url, app.settings.schema_name)
    from examples.django.shop.tasks import send_receipt

    try:
        with transaction.atomic():
            doomed = send_receipt.delay(1)  # written on Django's connection, in this block
            raise Rollback
    except Rollback:
        pass
    with transaction.atomic():
        kept = send_receipt.delay(2)
        send_receipt.delay_on_commit(3)  # enqueued by on_commit, after the block commits
    Worker(app, pool="threads", concurrency=2, burst=True, queues=["shop"]).run()
    print(f"rolled back: {doomed.state}")
    print(f"committed: {kept.get(timeout=10)}")
    app.close()


if __name__ == "__main__":
    main()
