"""Spare workers (`magpie.harness.spares`): an edited candidate, kept warm, is loaded into a
process started before the edit, whose compiler caches become its own content's; one spare at
a time per way of starting; a spare's share of the device lock ends with its preparing; a
Triton spare starts the compiler and builds its implementation's launchers beforehand
(`magpie.harness.triton_warmup`), taking from code under test only type names."""

import json
import os
import threading
import time

import pytest
from conftest import FIXTURES, build_json, magpie, relu2_report

from magpie import environment
from magpie.harness import spares, triton_warmup, wire
from magpie.supervision import device_lock, zygote_server
from magpie.supervision import scratch as scratch_folders

# A candidate that leaves a mark in its Triton cache as it is loaded: where its writes land.
MARKING = """
import os, pathlib
pathlib.Path(os.environ["TRITON_CACHE_DIR"], "loaded-" + os.environ.get("MARK", "x")).write_text(__name__)
"""


def test_an_edited_candidate_kept_warm_is_loaded_into_a_spare_whose_caches_become_its_contents(
    tmp_path, monkeypatch, short_tmp
):
    monkeypatch.setenv("MAGPIE_KEEP_WARM_S", "20")
    monkeypatch.setenv("TMPDIR", str(short_tmp))  # a warm zygote of this test's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = (FIXTURES / "adversarial" / "good.py").read_text()
    relu2_report(tmp_path, ["twin"], shapes="[[33, 65]]", sources={"twin": good + MARKING})
    compiled = tmp_path / "cache" / "magpie" / "compiled"
    waiting = list(compiled.glob("spare-*"))
    assert len(waiting) == 1, waiting  # one spare for the project's workers, however many were new
    (tmp_path / "twin.py").write_text(good + MARKING + "# edited\n")
    assert build_json(tmp_path, "-j", "2")["failed"] == []
    results = [json.loads(p.read_text()) for p in (tmp_path / "workspaces/store").glob("*/*/result.json")]
    checked = max(
        (r for r in results if r.get("task") == "correctness:relu2/twin"), key=lambda r: r["task_started_unix"]
    )
    assert [load.get("spare") for load in checked["worker_loads_s"]] == [True], checked["worker_loads_s"]
    assert not waiting[0].exists()  # renamed: now the edited content's caches
    marks = sorted(p.relative_to(compiled).parts[0] for p in compiled.rglob("loaded-*"))
    # the first content's worker and the edited one's: each wrote into its own content's cache
    assert len(marks) == 2 and not any(m.startswith(spares.PREFIX) for m in marks), marks
    assert len(set(p.parent for p in compiled.rglob("loaded-*"))) == 2
    assert len(list(compiled.glob("spare-*"))) == 1  # the next edit's, started by the one that took it


def test_one_spare_at_a_time_per_way_of_starting(monkeypatch):
    children = zygote_server.Children()
    assert children.reserve("spare-a") and not children.reserve("spare-a")
    assert children.reserve("spare-b")
    monkeypatch.setattr(time, "monotonic", lambda: 10**9)  # a reservation whose spare never came
    assert children.reserve("spare-a")


def test_a_spares_share_of_the_device_lock_holds_measurements_off_until_closed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv(environment.DEVICE_LOCK_TIMEOUT_S, "0.3")
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
        kernel,
        ["*kbf16", "fp8e4nv", "u1", "nvTmaDesc"],
    ]
    assert (
        triton_warmup.signatures(
            [["*fp32", 'i32);system("x")'], ["tensordesc<fp16[64, 64]>"], [], ["i32"] * 65, "i32", [3], None]
        )
        == []
    )
    assert triton_warmup.signatures({"a": ["i32"]}) == []
    assert len(triton_warmup.signatures([["i32"] * n for n in range(1, 9)])) == triton_warmup.MOST_SIGNATURES


def test_a_workers_recorder_keeps_each_compiled_kernels_signature_once():
    recorder = triton_warmup.Recorder()
    for signature in (
        {"x": "*fp32", "n": "i32", "B": "constexpr"},
        {"x": "*fp32", "n": "i32", "B": "constexpr"},
        {"pair": ("*fp32", "*fp32")},
        {"y": "*fp16"},
    ):  # as Triton calls its post-compile hook
        recorder(
            key=None,
            repr="k",
            fn=None,
            compile={"signature": signature},
            is_manual_warmup=False,
            already_compiled=False,
        )
    assert recorder.signatures == [["*fp32", "i32", "constexpr"], ["*fp16"]]


def test_a_spares_triton_warm_up_runs_beside_its_preparing_and_the_load_waits_for_it(monkeypatch):
    """The warm-up's compiles need neither the context nor the device lock: they run on a
    thread while the spare makes its context, and the load of the code starts only once they
    are done (Triton's compiles are not made to run side by side)."""
    from magpie.harness import worker
    from magpie.harness.laps import Laps

    prepared, done = threading.Event(), []
    # the warm-up finishes only once preparing has: were it waited for there, it would time out
    monkeypatch.setattr(triton_warmup, "warm", lambda given: done.append((prepared.wait(10), given)))
    monkeypatch.setattr(worker, "HELD_FD", None)
    worker.prepare(wire.Prepare(device="cpu", triton_signatures=[["*fp32", "i32"]]))
    prepared.set()
    laps = Laps()
    worker.await_warmup(laps)
    assert done == [(True, [["*fp32", "i32"]])] and "triton_warmup_wait" in laps.seconds
    assert worker.WARMUP is None
    worker.await_warmup(laps)  # a second load (or one without a warm-up) waits for nothing
    monkeypatch.setattr(worker, "PREPARED", False)
    monkeypatch.setattr(worker, "TIMER", None)


TRITON_CANDIDATE = """
import torch, triton, triton.language as tl
@triton.jit
def _k(x, o, n, B: tl.constexpr):
    off = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(o + off, tl.maximum(tl.load(x + off, mask=off < n), 0) * 2, mask=off < n)
def kernel(x):
    o = torch.empty_like(x)
    _k[(triton.cdiv(x.numel(), 256),)](x, o, x.numel(), B=256)
    return o
"""


def _listing(folder, since: float) -> str:
    """Every file under folder, with its age against `since`: what a failure shows."""
    return "\n".join(
        f"{p.relative_to(folder)}  {p.stat().st_mtime - since:+.3f} s" for p in sorted(folder.rglob("*")) if p.is_file()
    )


@pytest.mark.gpu
def test_an_edited_triton_candidate_finds_its_launcher_built_by_the_spare(tmp_path, monkeypatch, short_tmp):
    """The spare a Triton candidate's timing starts compiles magpie's warm-up kernel and the
    launcher of the candidate's kernel signature into its cache; the candidate edited again,
    loaded into it, finds that launcher there (built before its kernel was compiled) and
    compiles only its kernel."""
    monkeypatch.setenv("MAGPIE_KEEP_WARM_S", "30")
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "spec.py").write_text((FIXTURES / "adversarial" / "spec.py").read_text())
    (tmp_path / "good.py").write_text((FIXTURES / "adversarial" / "good.py").read_text())
    (tmp_path / "tri.py").write_text(TRITON_CANDIDATE)
    args = [
        "compare",
        "good.py",
        "tri.py",
        "--type",
        "triton",
        "--entry",
        "kernel",
        "--spec",
        "spec.py",
        "--shapes",
        "33x65",
        "--budget-ms",
        "60",
        "--device",
        "cuda",
        "--no-profile",
        "-o",
        "out",
    ]
    compiled = tmp_path / "cache" / "magpie" / "compiled"
    magpie(*args, cwd=tmp_path, check=0)
    for edit in range(2):  # the second finds the spare the first edit's timing started
        (tmp_path / "tri.py").write_text(TRITON_CANDIDATE + f"# edit {edit}\n")
        edited_at = time.time()
        magpie(*args, cwd=tmp_path, check=0)
    # how the workers start / what they loaded: the caches the last edit's kernel was compiled into
    edited = [
        folder
        for folder in compiled.glob("*/*")
        if any(p.stat().st_mtime > edited_at for p in folder.rglob("_k.cubin"))
    ]
    assert len(edited) == 1, _listing(compiled, edited_at)
    assert list(edited[0].rglob("magpie_warmup.cubin")), _listing(edited[0], edited_at)  # a spare's cache
    launchers = list(edited[0].rglob("__triton_launcher*.so"))
    kernel = min(p.stat().st_mtime for p in edited[0].rglob("_k.*"))
    assert len(launchers) == 1 and launchers[0].stat().st_mtime < kernel, _listing(edited[0], edited_at)
