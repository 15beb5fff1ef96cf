"""The device lock: checks share a device, a measurement holds it alone, and a waiting
measurement is not starved by checks that keep arriving."""

import multiprocessing
import time
import uuid

from magpie.harness import device_lock


def _hold(device: str, kind: str, seconds: float, log, ready) -> None:
    ready.set()
    with getattr(device_lock, kind)(device):
        log.put((kind, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((kind, "out", time.monotonic()))


def _run(steps: list[tuple[str, float, float]]) -> list[tuple[str, str]]:
    """Start holders one after another (kind, seconds held, pause before the next); the order
    in which they entered and left."""
    context = multiprocessing.get_context("fork")
    device = f"test-{uuid.uuid4().hex[:8]}"
    log = context.Queue()
    procs = []
    for index, (kind, held, pause) in enumerate(steps):
        ready = context.Event()
        proc = context.Process(target=_hold, args=(device, kind, held, log, ready), name=f"{kind}{index}")
        proc.start()
        ready.wait(10)
        procs.append(proc)
        time.sleep(pause)
    for proc in procs:
        proc.join(30)
    events = sorted((log.get(timeout=5) for _ in range(2 * len(steps))), key=lambda e: e[2])
    return [(kind, edge) for kind, edge, _ in events]


def test_sharers_overlap_and_a_measurement_waits_for_them():
    order = _run([("shared", 0.6, 0.2), ("shared", 0.6, 0.2), ("exclusive", 0.1, 0.0)])
    # both sharers were in before either left; the measurement came in only after both left
    assert order[:2] == [("shared", "in"), ("shared", "in")]
    assert order[2:] == [("shared", "out"), ("shared", "out"), ("exclusive", "in"), ("exclusive", "out")]


def test_a_waiting_measurement_goes_before_sharers_that_arrive_after_it():
    order = _run([("shared", 0.8, 0.2), ("exclusive", 0.3, 0.3), ("shared", 0.1, 0.0)])
    assert order == [("shared", "in"), ("shared", "out"), ("exclusive", "in"), ("exclusive", "out"),
                     ("shared", "in"), ("shared", "out")]
