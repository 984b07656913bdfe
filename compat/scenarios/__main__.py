"""``python -m scenarios --list | --ping QUEUE | NAME OUTFILE`` (run by the harness)."""

import json
import sys
import time
import traceback

from scenarios import REGISTRY, WAIT, exc, load_all


def main(argv: list[str]) -> int:
    if argv[0] == "--list":
        load_all()
        meta = [{k: v for k, v in s.items() if k != "fn"} for s in REGISTRY.values()]
        print(json.dumps(meta))
        return 0
    if argv[0] == "--ping":
        from proj.tasks import ping

        return 0 if ping.apply_async(queue=argv[1]).get(timeout=WAIT * 3) == "pong" else 1
    name, out = argv
    load_all()
    record: dict = {"name": name, "status": "ok", "observed": {}}
    started = time.monotonic()
    try:
        REGISTRY[name]["fn"](record["observed"])
    except Exception as e:
        record["status"] = "error"
        record["error"] = exc(e)
        record["traceback"] = traceback.format_exc()
    record["seconds"] = round(time.monotonic() - started, 2)
    with open(out, "w") as f:
        json.dump(record, f, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
