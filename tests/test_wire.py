"""The typed wire (`magpie/harness/wire.py`): what crosses into an evaluator is decoded there, a
malformed message failing in one line that names its field; the results a build writes keep
Magpie's keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from conftest import kernel_table, project_toml

from magpie.errors import UserError
from magpie.graph.expand import resolved_settings
from magpie.harness import wire
from magpie.manifest import models
from magpie.manifest.load import load_manifest

FIXTURES = Path(__file__).parent / "fixtures" / "wire"
# Result keys present only where a measurement was in doubt, implausible or taken again: a busy
# machine decides whether a build has them, not the code.
CONDITIONAL_KEYS = {"busy_remeasured", "remeasured", "retiming", "first_use", "provisional", "implausible"}


def test_a_built_projects_results_keep_their_keys(timed_pair):
    """The correctness and timing results of the baseline-and-copy project keep every key (top level
    and Magpie's nested records) they had before the wire was typed (recorded from that code): none
    lost or renamed. Keys added since by what wraps the evaluator's result (`measured_on`) may be there too."""
    recorded = json.loads((FIXTURES / "relu2_pair_result_keys.json").read_text())
    found: dict[str, dict] = {}
    for path in timed_pair.glob("workspaces/store/*/*/result.json"):
        result = json.loads(path.read_text())
        if result.get("task") in recorded:
            found[result["task"]] = result
    assert sorted(found) == sorted(recorded)
    for task, parts in recorded.items():
        for part, keys in parts.items():
            value = found[task] if part == "" else found[task].get(part)
            assert isinstance(value, dict), (task, part)
            assert set(keys) - CONDITIONAL_KEYS <= set(value), (task, part)


def served_answers(module: str, *commands: bytes) -> list[dict]:
    """The answers of a real process serving commands (`python -m module`: an evaluator, a
    worker) to `commands`."""
    command_read, command_write = os.pipe()
    answer_read, answer_write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(command_read), str(answer_write)],
        pass_fds=(command_read, answer_write),
        stderr=subprocess.DEVNULL,
    )
    os.close(command_read)
    os.close(answer_write)
    with os.fdopen(command_write, "wb") as sent, os.fdopen(answer_read, "rb") as answers:
        sent.write(b"".join(line + b"\n" for line in (*commands, b'{"op": "exit"}')))
        sent.flush()
        replies = [json.loads(line) for line in answers]
    assert proc.wait(timeout=60) == 0
    return replies


def good_request(tmp_path) -> dict:
    return {
        "mode": "correctness",
        "root": str(tmp_path),
        "kernel": "k",
        "impl": {"id": "a", "type": "pytorch", "source": "a.py"},
        "settings": {"correctness": {"testcases": [], "seed": 0, "timeout_s": 10}, "project": {"device": "cpu"}},
        "work_dir": str(tmp_path),
    }


def test_a_malformed_request_fails_in_one_line_naming_the_field(tmp_path):
    """A request whose field is missing or of the wrong type, or a command the evaluator does not
    serve, is that job's failure in one line naming the field, not a KeyError from inside a job;
    the evaluator serves the next command."""
    missing = good_request(tmp_path)
    del missing["kernel"]
    wrong = good_request(tmp_path)
    wrong["settings"]["timing"] = {"budget_ms": "fast"}
    untested = good_request(tmp_path)
    untested["settings"]["correctness"]["testcases"] = [{"spec": "spec.py"}]  # no tolerances resolved
    paths = []
    for name, request in (("missing", missing), ("wrong", wrong), ("untested", untested)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(request))
        paths.append(path)
    replies = served_answers(
        "magpie.harness.evaluate",
        *(json.dumps({"op": "evaluate", "request": str(p)}).encode() for p in paths),
        b'{"op": "evaluat"}',
        b'{"op": "reset"}',
    )
    errors = [reply.get("error", "") for reply in replies]
    assert all("\n" not in error for error in errors)
    assert errors[0] == f"{paths[0]}: Object missing required field `kernel`"
    assert errors[1] == f"{paths[1]}: Expected `float`, got `str` - at `$.settings.timing.budget_ms`"
    assert "spec testcase spec.py has no rtol, atol or trials" in errors[2]
    assert errors[2].endswith("at `$.settings.correctness.testcases[0]`")
    assert errors[3] == "evaluator command: Invalid value 'evaluat' - at `$.op`"
    assert replies[4] == {"ok": True}


def test_the_wires_timing_defaults_are_the_manifests():
    """A timing setting left out of a request reads as the manifest's default (who times: `vouched`
    on the wire, `timed_by` in the manifest)."""
    manifest = models.TimingSettings().model_dump()
    manifest["vouched"] = manifest.pop("timed_by") == "evaluator"
    wire_defaults = msgspec.to_builtins(wire.TimingSettings())
    assert {key: wire_defaults[key] for key in manifest if key != "shapes"} == {
        key: value for key, value in manifest.items() if key != "shapes"
    }
    assert wire.TimingSettings().timeout_s == models.Defaults().timeout_s


def timing_of(tmp_path, timing: str) -> dict:
    """The resolved timing settings of a one-kernel project whose defaults' timing is `timing`."""
    (tmp_path / "magpie.toml").write_text(project_toml(kernel_table("k", "base", shapes="[[4]]"), timing=timing))
    for name in ("base.py", "spec.py"):
        (tmp_path / name).write_text("")
    manifest, _ = load_manifest(tmp_path / "magpie.toml")
    kernel = manifest.kernel[0]
    return resolved_settings(manifest, kernel, kernel.baseline)["timing"]


def test_timed_by_says_who_times_and_vouched_is_still_read(tmp_path):
    """`timing.timed_by = "evaluator" | "worker"` says who times a GPU kernel's calls; the older
    `vouched = true | false` means the same and keys the timing alike (a build's timings stay
    valid across the rename); both given and disagreeing is one line naming the field, exit 2."""
    worker = timing_of(tmp_path, 'timed_by = "worker"')
    assert worker["vouched"] is False and "timed_by" not in worker
    assert timing_of(tmp_path, "vouched = false") == worker
    assert (
        timing_of(tmp_path, 'timed_by = "evaluator"')
        == timing_of(tmp_path, "vouched = true")
        == timing_of(tmp_path, "")
    )
    assert timing_of(tmp_path, "")["vouched"] is True
    with pytest.raises(UserError) as raised:
        timing_of(tmp_path, 'timed_by = "worker"\nvouched = true')
    line = str(raised.value)
    assert "\n" not in line and "timing" in line and "disagree: give timed_by alone" in line


@pytest.mark.parametrize("kind", [wire.EvaluationRequest, wire.ProfileRequest])
def test_a_request_encodes_to_the_json_it_was_decoded_from(tmp_path, kind):
    """A Struct is the same JSON as the dict it replaced: decoded and encoded again, a build's
    request (all its fields given) comes back key for key."""
    request = good_request(tmp_path)
    request["impl"] = {
        "id": "a",
        "type": "triton",
        "source": "a.py",
        "source_files": ["helper.py"],
        "entry": "kernel",
        "working_dir": None,
        "env": {"X": "1"},
        "is_baseline": False,
        "library": None,
    }
    if kind is wire.ProfileRequest:
        request = {key: request[key] for key in ("root", "kernel", "impl", "settings")}
    decoded = wire.decode(json.dumps(request), kind, "request")
    again = json.loads(wire.encode(decoded))
    assert again["impl"] == request["impl"]
    assert set(request) <= set(again)


def test_a_malformed_worker_command_is_answered_in_one_line_naming_the_field():
    """What a worker is sent is decoded there too: a command of the wrong form is answered with the
    field it got wrong (the worker goes on serving), not a KeyError or a crash of the worker."""
    replies = served_answers(
        "magpie.harness.worker",
        b'{"op": "load", "id": "a", "device": "cpu", "seed": 0}',
        b'{"op": "batch", "calls": "many"}',
        b'{"op": "measure"}',
        b'{"op": "batch", "calls": 3}',
    )
    errors = [reply["error"] for reply in replies]
    assert errors[0] == "WireError: worker command: Object missing required field `source`"
    assert errors[1] == "WireError: worker command: Expected `int`, got `str` - at `$.calls`"
    assert errors[2] == "WireError: worker command: Invalid value 'measure' - at `$.op`"
    assert errors[3] == "RuntimeError: load must come first"
