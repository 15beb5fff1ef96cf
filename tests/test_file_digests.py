"""Large files' digests remembered by stat (magpie/store/digests.py): a remembered file is not read again, any change
of its stat (content, replacement, touch) means it is hashed again, a file written too recently is not remembered,
and a declared benchmark's multi-MB model file keys the task through that cache, not through snapshots."""

import hashlib
import json
import os
import time

from magpie.graph import expand as expand_mod
from magpie.store.digests import SETTLED_S, FileDigests


def _aged(path, seconds=10.0):
    """The file's mtime put in the past, as a model written a while ago has it (ctime stays now: see below)."""
    past = time.time() - seconds
    os.utime(path, (past, past))


def _settle(monkeypatch):
    """ctime cannot be set back: move the clock the cache reads forward instead."""
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + int((SETTLED_S + 1) * 1e9))


def test_a_remembered_digest_is_not_read_again_and_a_changed_file_is(tmp_path, monkeypatch):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    _aged(weights)
    _settle(monkeypatch)
    store = tmp_path / "file-digests.json"
    first = FileDigests(store)
    assert first.digest(weights) == hashlib.sha256(b"a" * 4096).hexdigest() and first.hashed_bytes == 4096
    first.save()
    again = FileDigests(store)
    assert again.digest(weights) == first.digest(weights) and again.hashed_bytes == 0  # remembered: not read
    weights.write_bytes(b"b" * 4096)  # same size, new content
    assert FileDigests(store).digest(weights) == hashlib.sha256(b"b" * 4096).hexdigest()
    replacement = tmp_path / "new"
    replacement.write_bytes(b"c" * 4096)
    os.replace(replacement, weights)  # another inode
    assert FileDigests(store).digest(weights) == hashlib.sha256(b"c" * 4096).hexdigest()
    other = tmp_path / "other.bin"
    other.write_bytes(b"d")
    _aged(other)
    learning = FileDigests(store)
    learning.digest(other)
    weights.unlink()
    learning.save()  # a gone file's entry goes
    assert list(json.loads(store.read_text())) == [str(other)]


def test_a_file_written_just_now_is_hashed_again_next_time(tmp_path):
    fresh = tmp_path / "w.bin"
    fresh.write_bytes(b"x" * 100)
    store = tmp_path / "file-digests.json"
    digests = FileDigests(store)
    digests.digest(fresh)
    digests.save()
    assert not store.exists() or json.loads(store.read_text()) == {}
    later = FileDigests(store)
    later.digest(fresh)
    assert later.hashed_bytes == 100


def test_a_large_model_file_keys_the_benchmark_through_the_cache_without_a_snapshot(tmp_path, monkeypatch):
    from magpie.graph.rules import builtin_rules
    from magpie.manifest.models import Manifest
    from magpie.store import Store

    monkeypatch.setattr(expand_mod, "LARGE_FILE_BYTES", 1024)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with open(model / "weights.bin", "wb") as handle:
        handle.truncate(64 << 20)  # sparse 64 MiB
    _aged(model / "weights.bin")
    _settle(monkeypatch)
    manifest = Manifest.model_validate({"benchmark": [{"id": "b", "engine": "transformers", "model": "m"}]})
    rules = [r for r in builtin_rules() if r.name == "benchmark"]
    store = Store(tmp_path / "ws")
    spec = expand_mod.expand(manifest, tmp_path, rules, store.snapshots, store.file_digests)["benchmark:b"]
    assert store.file_digests.hashed_bytes == 64 << 20
    assert spec.parts["inputs"]["m/weights.bin"] == hashlib.sha256(bytes(64 << 20)).hexdigest()
    kept = [p.name for p in store.snapshots.rglob("*") if p.is_file()]
    assert kept == [spec.parts["inputs"]["m/config.json"]]  # the weights are not copied
    cached = Store(tmp_path / "ws")
    assert (
        expand_mod.expand(manifest, tmp_path, rules, cached.snapshots, cached.file_digests)["benchmark:b"].key
        == spec.key
        and cached.file_digests.hashed_bytes == 0
    )
    assert expand_mod.changed_inputs(tmp_path, spec.parts, cached.file_digests) == []
    with open(model / "weights.bin", "r+b") as handle:
        handle.write(b"\1")
    assert expand_mod.changed_inputs(tmp_path, spec.parts, cached.file_digests) == ["m/weights.bin"]
