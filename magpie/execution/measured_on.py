"""Where a timing was measured: recorded in its result, and read back to say whether it was here.

A timing's key holds its device's model (graph/fingerprint.py: `cpu:<model>:<cores>`,
`cuda:<name>:<sm>`), so a timing of another model is never reused: it is measured again. A
timing of the same model on another machine has the same key and is reused from a shared cache,
so its result says where it was measured: `measured_on` (the key's device, the GPU's UUID or
else this host's identity, the host's name), added by the build's executor (`Recording`) before
the result is signed and stored. A build's summary shows each timing as `this device, <date>`
or `cached (<device> on <host>, <date>)` (another device, or where its result does not say: a
Ray cluster's node), read from the stored result alone, so that a build and the no-op after it
say the same; a reused timing is never shown as measured here.
"""

from __future__ import annotations

import datetime
import socket
from concurrent.futures import Future
from functools import cache

from magpie.execution.devices import visible_gpus

RECORDED_RULES = frozenset({"timing", "profile"})


@cache
def this_host() -> tuple[str, str]:
    """This machine's name, and its identity: the name and the machine id where there is one
    (containers of one image may share the id, CI runners the name)."""
    name = socket.gethostname()
    try:
        with open("/etc/machine-id") as handle:
            machine = handle.read().strip()[:12]
    except OSError:
        machine = ""
    return name, f"{name}/{machine}" if machine else name


def measured_on(result: dict, device_fact: str | None, on_cluster: bool = False) -> dict:
    """What a measurement's result records of where it ran. `on_cluster`: the job ran on a node of
    a Ray cluster, whose host this process does not know (a GPU's UUID still says the device)."""
    gpu = (result.get("device") or {}).get("uuid")
    if on_cluster and not gpu:
        return {"device": device_fact, "id": None, "host": "a Ray cluster's node"}
    name, identity = this_host()
    return {"device": device_fact, "id": gpu or identity, "host": name}


class Recording:
    """An executor whose timing and profile results carry `measured_on` (the build's executor wrapped)."""

    def __init__(self, inner, on_cluster: bool = False):
        self.inner = inner
        self.on_cluster = on_cluster

    def submit(self, job) -> Future:
        inner = self.inner.submit(job)
        if job.spec.rule not in RECORDED_RULES:
            return inner
        fact = (job.spec.parts.get("fingerprint") or {}).get("device")
        outer: Future = Future()

        def record(done: Future) -> None:
            try:
                output = done.result()
            except BaseException as err:  # cancelled, or the job failed: as the inner future
                outer.set_exception(err)
                return
            output.result["measured_on"] = measured_on(output.result, fact, self.on_cluster)
            outer.set_result(output)

        inner.add_done_callback(record)
        return outer

    def __getattr__(self, name):  # shutdown, cancel, ...: the executor's own
        return getattr(self.inner, name)


@cache
def this_machine() -> frozenset[str]:
    """The identities a measurement made here records: this host's, and each visible GPU's UUID."""
    return frozenset({this_host()[1], *(gpu.uuid for gpu in visible_gpus() if gpu.uuid)})


def provenance(result: dict) -> str:
    """How a stored timing is shown: `this device, <date>` or `cached (<device> on <host>, <date>)`."""
    started = result.get("task_started_unix")
    date = (
        datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        if isinstance(started, (int, float))
        else "date not recorded"
    )
    where = result.get("measured_on")
    if not isinstance(where, dict):
        return f"cached (device not recorded, {date})"
    if where.get("id") in this_machine():
        return f"this device, {date}"
    device = (result.get("device") or {}).get("name")
    described = device if device and device != "cpu" else where.get("device") or "device not recorded"
    return f"cached ({described} on {where.get('host') or 'an unnamed host'}, {date})"


def mark_summary(summary: dict, tasks, store) -> dict:
    """The build summary (report/verdicts.py's dict) with each implementation's performance_result
    saying where its timing came from (`measured`: `provenance`). `tasks`: (name, rule, kernel,
    key) of the build's tasks."""
    timings = {name: key for name, rule, _kernel, key in tasks if rule == "timing"}
    for kernel in summary.get("kernels") or []:
        for impl in kernel.get("implementations") or []:
            performance = impl.get("performance_result")
            name = f"timing:{kernel['kernel']}/{impl['implementation']}"
            if not isinstance(performance, dict) or name not in timings or not store.has(timings[name]):
                continue
            performance["measured"] = provenance(store.read(timings[name]))
    return summary
