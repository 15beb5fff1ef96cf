"""What examples/ci/magpie.yml does, reproduced on this machine (issue 42.4): a protected branch's
run builds with the signing secret and saves the cache folder; another run (another runner, a
fresh clone at another path) restores it, and its build takes every artifact from it, each
checked, and runs nothing; an edited kernel runs only its own tasks and those above them; an
entry tampered with is found and built again; a timing made on another device is never shown
as measured here."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import FIXTURES, magpie, magpie_in_process, relu2_project
from test_remote_cache import CI_KEY, as_reader, executed, signer, sources

CI = {"MAGPIE_SIGNING_KEY": CI_KEY}


@pytest.fixture(scope="module")
def protected_run(tmp_path_factory) -> dict:
    """The workflow on a protected branch: nothing restored yet, `magpie build --cache C --cache-write`
    (C saved by actions/cache/save after it)."""
    root = tmp_path_factory.mktemp("main_branch")
    trusted = signer(CI_KEY, root)
    sources(root, trusted)
    cache = root.parent / f"{root.name}-cache"
    # a process, as the timed builds below are: each reads magpie's code afresh (this process's fingerprints
    # are kept from its first build)
    built = magpie("build", "--cache", cache, "--cache-write", cwd=root, env=CI, check=0)
    assert "cache: 18 artifacts put into" in built.stderr, built.stderr
    return {"root": root, "cache": cache, "signer": trusted}


def restored(run: dict, at: Path) -> tuple[Path, Path]:
    """Another runner: a fresh clone at another path, the cache folder restored beside it."""
    clone = sources(at / "checkout" / "project", run["signer"])
    cache = shutil.copytree(run["cache"], at / "restored-cache")
    return clone, cache


def test_a_fresh_clone_with_the_restored_cache_runs_nothing_within_twice_the_local_noop(protected_run, tmp_path):
    """Timed as processes, the best of three each: the build after the pull (the workflow's step
    against the restored store) beside the builder's own no-op."""
    reader_key = {"MAGPIE_SIGNING_KEY": secrets.token_hex(32)}  # a pull request's runner: not the secret
    local = []
    for _ in range(3):
        start = time.perf_counter()
        proc = magpie("build", cwd=protected_run["root"], env=CI, check=0)
        local.append(time.perf_counter() - start)
        assert "18 artifacts up to date" in proc.stdout
    fresh = []
    for attempt in range(3):
        clone, cache = restored(protected_run, tmp_path / str(attempt))
        magpie("cache", "pull", "--cache", cache, cwd=clone, env=reader_key, check=0)
        start = time.perf_counter()
        proc = magpie("build", cwd=clone, env=reader_key, check=0)
        fresh.append(time.perf_counter() - start)
        assert "magpie: 18 artifacts up to date" in proc.stdout, proc.stdout + proc.stderr
    assert min(fresh) <= 2 * min(local), (fresh, local)


def test_one_edited_kernel_runs_only_its_subtree(protected_run, tmp_path):
    clone, cache = restored(protected_run, tmp_path)
    (clone / "k2/c.py").write_text("def kernel(x):\n    return x - 0 + 0\n")
    built = as_reader("build", "--json", "--cache", cache, cwd=clone, check=0)
    assert sorted(executed(built)) == sorted(
        ["compile:k2/c", "correctness:k2/c", "timing:k2/c", "comparison:k2", "report"]
    ), built.stderr


def test_a_tampered_entry_of_a_restored_workspace_is_found_and_built_again(protected_run, tmp_path):
    """The workflow's other form: the workspace itself saved and restored. Its artifact, digests and
    index record rewritten together are still caught (the signature), and built here."""
    clone = sources(tmp_path / "clone", protected_run["signer"])
    shutil.copytree(protected_run["root"] / "workspaces", clone / "workspaces")
    record_path = clone / "workspaces/index" / (quote("correctness:k1/b", safe="") + ".json")
    record = json.loads(record_path.read_text())
    artifact = clone / "workspaces/store" / record["key"][:2] / record["key"]
    result = json.loads((artifact / "result.json").read_text())
    result["correctness_state"] = "FAILURE"
    data = json.dumps(result).encode()
    (artifact / "result.json").write_bytes(data)
    for holder in (record, json.loads((artifact / ".digest.json").read_text())):
        holder["files"]["result.json"] = [len(data), hashlib.sha256(data).hexdigest()]
        target = record_path if holder is record else artifact / ".digest.json"
        target.write_text(json.dumps(holder))
    built = magpie_in_process("build", "--json", cwd=clone, env=CI, check=0)
    assert "store: artifact of correctness:k1/b was modified after it was written" in built.stderr, built.stderr
    assert "correctness:k1/b" in executed(built)
    (kernel,) = [k for k in json.loads(built.stdout)["kernels"] if k["kernel"] == "k1"]
    assert {i["implementation"]: i["correctness_state"] for i in kernel["implementations"]}["b"] == "SUCCESS"


OTHER_RUNNER = ("other-runner", "other-runner/0123456789ab")


@pytest.fixture(scope="module")
def timed_elsewhere(tmp_path_factory) -> dict:
    """A timed project built and pushed by another runner of this CPU model: the same keys, another
    host (its identity forged at `measured_on.this_host`, where a build learns where it runs)."""
    from magpie.execution import measured_on
    from magpie.graph import fingerprint

    fingerprint.fingerprint.cache_clear()  # magpie's code as it is now, as the processes below read it
    root = tmp_path_factory.mktemp("timed_elsewhere")
    shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
    relu2_project(root, ["fast"], "[[8, 16]]", defaults="trials = 1")
    trusted = signer(CI_KEY, root)
    manifest = root / "magpie.toml"
    manifest.write_text(manifest.read_text() + f'\n[store]\ntrusted_signers = ["{trusted}"]\n')
    cache = root.parent / f"{root.name}-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measured_on, "this_host", lambda: OTHER_RUNNER)
        measured_on.this_machine.cache_clear()  # that runner's identities, not this process's kept ones
        built = magpie_in_process("build", "--json", "--cache", cache, "--cache-write", cwd=root, env=CI, check=0)
    measured_on.this_machine.cache_clear()
    return {"root": root, "cache": cache, "summary": json.loads(built.stdout)}


def measured(summary: dict) -> dict[str, str]:
    (kernel,) = summary["kernels"]
    return {i["implementation"]: i["performance_result"]["measured"] for i in kernel["implementations"]}


def test_a_timing_made_on_another_device_is_never_shown_as_fresh(timed_elsewhere, tmp_path):
    on_that_runner = measured(timed_elsewhere["summary"])
    assert all(value.startswith("this device, ") for value in on_that_runner.values()), on_that_runner
    clone = tmp_path / "clone"
    shutil.copytree(timed_elsewhere["root"], clone, ignore=shutil.ignore_patterns("workspaces"))
    built = as_reader("build", "--json", "--cache", timed_elsewhere["cache"], cwd=clone, check=0)
    summary = json.loads(built.stdout)
    assert summary["executed"] == [], built.stderr
    shown = measured(summary)
    for impl in ("fast", "good"):
        assert shown[impl].startswith("cached (cpu:") and " on other-runner, " in shown[impl], shown
    noop = as_reader("build", "--json", cwd=clone, check=0)  # the no-op reads them the same
    assert measured(json.loads(noop.stdout)) == shown


def test_a_timing_of_another_device_model_is_measured_here_not_taken(timed_elsewhere, tmp_path):
    """Another CPU model (the device fact of keys forged at graph/fingerprint.py's table): its timing's
    key is another, so the cache's is not taken: the dry run after the pull would measure it here."""
    from magpie.graph import fingerprint

    clone = tmp_path / "clone"
    shutil.copytree(timed_elsewhere["root"], clone, ignore=shutil.ignore_patterns("workspaces"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(fingerprint._FACTS, "device", lambda device: "cpu:Another CPU model:64")
        fingerprint.fingerprint.cache_clear()
        try:
            pulled = as_reader("cache", "pull", "--cache", timed_elsewhere["cache"], cwd=clone, check=0)
            plan = as_reader("build", "--dry-run", "--json", cwd=clone, check=0)
        finally:
            fingerprint.fingerprint.cache_clear()
    assert "2 artifacts taken" in pulled.stdout, pulled.stdout  # the compiles: python's fact, not the device's
    would_run = {row["task"] for row in json.loads(plan.stdout)["would_run"]}
    assert {"timing:relu2/fast", "timing:relu2/good", "correctness:relu2/fast"} <= would_run


@pytest.mark.gpu
def test_a_gpu_timing_restored_on_another_runner_is_shown_cached(tmp_path):
    """On the H200: a timing of this GPU read back here is `this device`; read where the GPU's UUID is
    not among the machine's (another runner, its identities given at `measured_on.this_machine`), cached."""
    from magpie.execution import measured_on

    root = tmp_path / "gpu"
    root.mkdir()
    shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
    relu2_project(root, ["fast"], "[[256, 1024]]", device="cuda", defaults="trials = 1")
    trusted = signer(CI_KEY, root)
    (root / "magpie.toml").write_text(
        (root / "magpie.toml").read_text() + f'\n[store]\ntrusted_signers = ["{trusted}"]\n'
    )
    cache = tmp_path / "cache"
    magpie_in_process("build", "--cache", cache, "--cache-write", cwd=root, env=CI, check=0)
    clone = tmp_path / "clone"
    shutil.copytree(root, clone, ignore=shutil.ignore_patterns("workspaces"))
    here = json.loads(as_reader("build", "--json", "--cache", cache, cwd=clone, check=0).stdout)
    assert here["executed"] == []
    assert all(value.startswith("this device, ") for value in measured(here).values()), measured(here)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measured_on, "this_machine", lambda: frozenset({"another-runner"}))
        elsewhere = json.loads(as_reader("build", "--json", cwd=clone, check=0).stdout)
    assert all(value.startswith("cached (NVIDIA ") for value in measured(elsewhere).values()), measured(elsewhere)
