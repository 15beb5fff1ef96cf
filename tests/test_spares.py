"""Spare workers (`magpie.harness.spares`): an edited candidate, kept warm, is loaded into a
process started before the edit, whose compiler caches become its own content's; one spare at
a time per way of starting; a spare's share of the device lock ends with its preparing; a
Triton spare starts the compiler and builds its implementation's launchers beforehand
(`magpie.harness.triton_warmup`), taking from code under test only type names."""

import json
import os
import time

import pytest

from conftest import FIXTURES, build_json, relu2_report
from magpie.harness import spares, triton_warmup
from magpie.supervision import device_lock, zygote
from magpie.supervision import scratch as scratch_folders

# A candidate that leaves a mark in its Triton cache as it is loaded: where its writes land.
MARKING = """
import os, pathlib
pathlib.Path(os.environ["TRITON_CACHE_DIR"], "loaded-" + os.environ.get("MARK", "x")).write_text(__name__)
"""


def test_an_edited_candidate_kept_warm_is_loaded_into_a_spare_whose_caches_become_its_contents(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("MAGPIE_KEEP_WARM_S", "20")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # a warm zygote of this test's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    good = (FIXTURES / "adversarial" / "good.py").read_text()
    relu2_report(tmp_path, ["twin"], shapes="[[33, 65]]", sources={"twin": good + MARKING})
    compiled = tmp_path / "cache" / "magpie" / "compiled"
    waiting = list(compiled.glob("spare-*"))
    assert len(waiting) == 1, waiting  # one spare for the project's workers, however many were new
    (tmp_path / "twin.py").write_text(good + MARKING + "# edited\n")
    assert build_json(tmp_path, "-j", "2")["failed"] == []
    results = [json.loads(p.read_text()) for p in (tmp_path / "workspaces/store").glob("*/*/result.json")]
    checked = max((r for r in results if r.get("task") == "correctness:relu2/twin"),
                  key=lambda r: r["task_started_unix"])
    assert [load.get("spare") for load in checked["worker_loads_s"]] == [True], checked["worker_loads_s"]
    assert not waiting[0].exists()  # renamed: now the edited content's caches
    marks = sorted(p.relative_to(compiled).parts[0] for p in compiled.rglob("loaded-*"))
    # the first content's worker and the edited one's: each wrote into its own content's cache
    assert len(marks) == 2 and not any(m.startswith(spares.PREFIX) for m in marks), marks
    assert len(set(p.parent for p in compiled.rglob("loaded-*"))) == 2
    assert len(list(compiled.glob("spare-*"))) == 1  # the next edit's, started by the one that took it


def test_one_spare_at_a_time_per_way_of_starting(monkeypatch):
    children = zygote.Children()
    assert children.reserve("spare-a") and not children.reserve("spare-a")
    assert children.reserve("spare-b")
    monkeypatch.setattr(time, "monotonic", lambda: 10 ** 9)  # a reservation whose spare never came
    assert children.reserve("spare-a")


def test_a_spares_share_of_the_device_lock_holds_measurements_off_until_closed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv(device_lock.TIMEOUT_VARIABLE, "0.3")
    with device_lock.shared("cpu"):
        held = device_lock.share_held("cpu")
    assert held is not None
    with pytest.raises(device_lock.DeviceLockTimeout), device_lock.exclusive("cpu"):
        pass
    os.close(held)
    with device_lock.exclusive("cpu"):
        pass


def test_the_caches_of_spares_that_ended_unadopted_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    alive = scratch_folders.make("w-")
    try:
        kept, gone = spares.caches_folder(alive), spares.caches_folder(tmp_path / "w-ended")
        for folder in (kept, gone):
            folder.mkdir(parents=True)
        spares.sweep_caches()
        assert kept.exists() and not gone.exists()
    finally:
        scratch_folders.remove(alive)


def test_launch_signatures_from_a_worker_are_lists_of_type_names_at_most_four():
    kernel = ["*fp32", "*fp32", "*fp32", "i32", "constexpr"]
    assert triton_warmup.signatures([kernel, kernel, ["*kbf16", "fp8e4nv", "u1", "nvTmaDesc"]]) == [
        kernel, ["*kbf16", "fp8e4nv", "u1", "nvTmaDesc"]]
    assert triton_warmup.signatures([["*fp32", "i32);system(\"x\")"], ["tensordesc<fp16[64, 64]>"], [],
                                     ["i32"] * 65, "i32", [3], None]) == []
    assert triton_warmup.signatures({"a": ["i32"]}) == []
    assert len(triton_warmup.signatures([["i32"] * n for n in range(1, 9)])) == triton_warmup.MOST_SIGNATURES


def test_a_workers_recorder_keeps_each_compiled_kernels_signature_once():
    recorder = triton_warmup.Recorder()
    for signature in ({"x": "*fp32", "n": "i32", "B": "constexpr"}, {"x": "*fp32", "n": "i32", "B": "constexpr"},
                      {"pair": ("*fp32", "*fp32")}, {"y": "*fp16"}):  # as Triton calls its post-compile hook
        recorder(key=None, repr="k", fn=None, compile={"signature": signature}, is_manual_warmup=False,
                 already_compiled=False)
    assert recorder.signatures == [["*fp32", "i32", "constexpr"], ["*fp16"]]

