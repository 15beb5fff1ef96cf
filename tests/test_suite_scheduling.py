"""The test suite's own scheduling under pytest-xdist (README's `-n N --dist loadgroup`): a test named
in `serial_tests` has the machine to itself, the others run side by side."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

RECORDING_TEST = """
import json
import os
import time


def _record(name):
    start = time.monotonic()
    time.sleep(1.0)
    with open(os.environ["INTERVALS"], "a") as out:
        out.write(json.dumps([name, start, time.monotonic()]) + "\\n")
"""


def _overlap(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_a_serial_test_runs_with_no_other_beside_it_and_the_others_share_the_workers(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nserial_tests =\n    test_alone.py\n")
    (tmp_path / "test_shared.py").write_text(
        RECORDING_TEST + "".join(f"\n\ndef test_shared_{n}():\n    _record('shared_{n}')\n" for n in range(4))
    )
    (tmp_path / "test_alone.py").write_text(RECORDING_TEST + "\n\ndef test_alone():\n    _record('alone')\n")
    intervals = tmp_path / "intervals.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "INTERVALS": str(intervals)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [json.loads(line) for line in intervals.read_text().splitlines()]
    alone = next(run for run in runs if run[0] == "alone")
    shared = [run for run in runs if run[0] != "alone"]
    assert len(shared) == 4
    assert not [run[0] for run in shared if _overlap(run, alone)]
    # the others did run side by side: what is checked above is a choice, not three idle workers
    assert any(_overlap(a, b) for i, a in enumerate(shared) for b in shared[i + 1 :])
