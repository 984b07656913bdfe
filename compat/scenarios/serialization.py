"""The json serializer's types, both ways."""

import datetime
import decimal
import uuid

from scenarios import WAIT, scenario


def _types(value):
    return {k: type(v).__name__ for k, v in value.items()}


@scenario("json serializer types")
def json_argument_types(obs):
    """datetime, date, Decimal, UUID, tuple and bytes-free values as arguments: what the task
    receives."""
    from proj.tasks import echo_types

    values = {
        "when": datetime.datetime(2024, 5, 17, 12, 30, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2024, 5, 17),
        "amount": decimal.Decimal("12.50"),
        "ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "pair": (1, 2),
        "nested": {"a": [1, 2.5, None, True]},
    }
    got = echo_types.delay(values).get(timeout=WAIT)
    obs["types_in_task"] = got["types"]
    obs["types_back"] = _types(got["values"])
    obs["equal_back"] = {k: got["values"][k] == v for k, v in values.items()}


@scenario("json serializer types")
def json_result_types(obs):
    """datetime, date, Decimal, UUID and tuple as a return value: what the caller gets."""
    from proj.tasks import typed_values

    got = typed_values.delay().get(timeout=WAIT)
    obs["types"] = _types(got)
    obs["when"] = str(got["when"])
    obs["amount"] = str(got["amount"])
