"""The calls-alone bound under load (issue 37.1): in two CI runs at load 7-14 an honest candidate
(relu, 68.4 µs a call in its batches) beside a baseline that spins 2 ms of wall time a call was
failed `calls_done_together`: "its calls made alone took -178 µs a call against the baseline's, so
at least 1.26e+03 µs a call, 18x what its batches read". The baseline's calls made alone, their
waits for a CPU taken off, read about 250 µs against 2,000 in its batches; the difference against
them was added to its batches' 2,000. Which of the baseline's readings is true cannot be told
(beside CPU hogs a relu's batches read 299 µs against 70 alone, the batches inflated), so such a
failure is in doubt: measured again, then inconclusive, never FAILED. These are those readings,
and a cheat's beside them."""

from magpie.harness.judging import judge_retiming
from magpie.harness.measurement import ALONE_FAIL, INCONCLUSIVE, alone_bound
from magpie.harness.rounds import Rounds
from magpie.harness.spec import Case


def in_doubt(bound: dict, cpu_wait_share: float) -> list[str]:
    measured = Rounds(["baseline", "candidate"], vouched=True)
    measured.alone_bound, measured.cpu_wait_share = bound, cpu_wait_share
    return measured.in_doubt()


def calls_alone(call_us: float, wobble_us: float, count: int = 4) -> list[float]:
    """What a call cost in each of `count` batches handed over, in ns."""
    return [(call_us + wobble_us * (-1) ** i) * 1000 for i in range(count)]


CASE = Case(label="8x128", shape=[8, 128], dtype="float32", trial=0, seed=0)
# the baseline's batches read 2 ms a call (its spin), its calls alone a load burst's 250 µs
BUSY_BASELINE = {"alone": calls_alone(250.0, 60.0), "batched_ns": 2_000_000.0}


def test_an_honest_candidate_beside_a_baseline_whose_calls_alone_read_short_is_in_doubt_not_accused():
    """Its failure is in doubt whether or not the measurement's own waits read the machine busy
    (the baseline's readings disagreeing is the machine's doing), at 18x, past the ratio a busy
    machine's doubt otherwise stops at."""
    bound = alone_bound(
        {"candidate": calls_alone(72.0, 5.0), "baseline": BUSY_BASELINE["alone"]},
        {"baseline": BUSY_BASELINE["batched_ns"], "candidate": 68_400.0},
    )
    assert bound["failed"] and bound["reference_disturbed"] and bound["ratio_alone_reference"] <= 1.0, bound
    for cpu_wait_share in (0.1, 0.6):
        assert in_doubt(bound, cpu_wait_share), cpu_wait_share


def test_calls_done_together_still_fail_beside_a_baseline_whose_calls_alone_read_short():
    """One operation over the batch: its calls alone cost 200 µs, its batches 5 µs a call."""
    bound = alone_bound(
        {"candidate": calls_alone(200.0, 5.0), "baseline": BUSY_BASELINE["alone"]},
        {"baseline": BUSY_BASELINE["batched_ns"], "candidate": 5_000.0},
    )
    assert bound["reference_short"] and bound["failed"] and not bound["reference_disturbed"], bound
    assert bound["ratio_alone_reference"] > 3 * ALONE_FAIL, bound
    assert in_doubt(bound, 0.1) == [] and in_doubt(bound, 0.6) == []


def test_a_baseline_whose_calls_alone_read_a_third_short_is_still_the_reference():
    """A longer call's calls alone read up to a third short of its batches, honestly: its batches
    stay the reference, as before: a quiet machine's failure stands."""
    bound = alone_bound(
        {"candidate": calls_alone(8.42, 0.2), "baseline": calls_alone(8.5, 0.2)},
        {"baseline": 13_230.0, "candidate": 600.0},
    )
    assert bound["failed"] and not bound["reference_short"] and not bound["reference_disturbed"], bound
    assert in_doubt(bound, 0.1) == []


def test_a_retiming_failed_only_by_a_baseline_whose_calls_alone_read_short_is_inconclusive():
    """The re-timing of an implausible speedup is not measured again: such a failure there leaves
    the timing inconclusive (not stored as final), a cheat's fails it."""
    honest = alone_bound(
        {"candidate": calls_alone(72.0, 5.0), "baseline": BUSY_BASELINE["alone"]},
        {"baseline": BUSY_BASELINE["batched_ns"], "candidate": 68_400.0},
    )
    cheat = alone_bound(
        {"candidate": calls_alone(200.0, 5.0), "baseline": BUSY_BASELINE["alone"]},
        {"baseline": BUSY_BASELINE["batched_ns"], "candidate": 5_000.0},
    )
    states = []
    for bound in (honest, cheat):
        retimed = Rounds(["baseline", "candidate"], vouched=True)
        for role, call_ns in (("baseline", 2_000_000), ("candidate", 68_400)):
            for _ in range(3):
                retimed.add_batch(role, 0, call_ns * 10, 10, 0.001)
        retimed.settle_samples(capped=True)
        retimed.methods = {"baseline": "batches", "candidate": "batches"}
        retimed.alone_bound, retimed.cpu_wait_share = bound, 0.1
        result = {"performance_state": "SUCCESS", "errors": [], "warnings": [], "flags": [], "failures": []}
        judge_retiming(result, retimed, 10.0, CASE, 0, {"baseline": None, "candidate": None}, "cpu")
        states.append((result["performance_state"], [f["kind"] for f in result["failures"]]))
    assert states == [(INCONCLUSIVE, ["inconclusive_machine_busy"]), ("FAILED", ["calls_done_together"])], states
