"""Tasks declared with ``@shared_task``: no app import."""

from celery import shared_task


@shared_task
def shout(word):
    return word.upper()


@shared_task(bind=True, name="custom.shared.name")
def named(self, x):
    return {"name": self.name, "x": x}
