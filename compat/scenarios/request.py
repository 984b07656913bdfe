"""``bind=True`` and ``self.request`` inside the worker."""

from scenarios import WAIT, scenario


@scenario("bind=True and self.request")
def request_fields(obs):
    """id, args, kwargs, retries, called_directly, is_eager, hostname, delivery_info."""
    from proj.tasks import introspect

    res = introspect.delay(1, b="two")
    seen = res.get(timeout=WAIT)
    obs["id_matches"] = seen.pop("id") == res.id
    seen.pop("root_id")
    obs["request"] = seen
