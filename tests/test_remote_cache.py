"""The shared cache (issue 42.3): a folder of signed artifacts that builders push to and readers pull
from, every artifact checked on the way in (digests, then a signature by a trusted signer), read-only
unless asked, written only by a trusted builder. One project built once by "CI" (its signing key
the secret, trusted by the manifest); each reader is another machine: its own key, a fresh copy
of the sources at another path."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, magpie_in_process, write

CI_KEY = secrets.token_hex(32)


def signer(key: str, cwd: Path) -> str:
    return magpie_in_process("key", cwd=cwd, env={"MAGPIE_SIGNING_KEY": key}, check=0).stdout.strip()


def sources(root: Path, trusted: str) -> Path:
    """The command project's sources, trusting `trusted`'s artifacts: what a fresh clone holds."""
    write(root, COMMAND_PROJECT)
    manifest = root / "magpie.toml"
    manifest.write_text(
        manifest.read_text().replace("[[kernel]]", f'[store]\ntrusted_signers = ["{trusted}"]\n\n[[kernel]]', 1)
    )
    return root


def as_reader(*args, cwd: Path, key: str | None = None, check=None):
    """The CLI run on a reader's machine: its own signing key."""
    return magpie_in_process(*args, cwd=cwd, env={"MAGPIE_SIGNING_KEY": key or secrets.token_hex(32)}, check=check)


def executed(proc) -> list[str]:
    return json.loads(proc.stdout)["executed"]


@pytest.fixture(scope="module")
def ci(tmp_path_factory) -> dict:
    """The project built by CI and pushed into a cache folder: {root, cache, signer}."""
    root = tmp_path_factory.mktemp("ci_build")
    trusted = signer(CI_KEY, root)
    sources(root, trusted)
    ci_env = {"MAGPIE_SIGNING_KEY": CI_KEY}
    magpie_in_process("build", cwd=root, env=ci_env, check=0)
    cache = tmp_path_factory.mktemp("cache") / "shared"
    pushed = magpie_in_process("cache", "push", "--cache", cache, "--cache-write", cwd=root, env=ci_env, check=0)
    assert "18 artifacts put into" in pushed.stdout
    return {"root": root, "cache": cache, "signer": trusted}


def key_of(root: Path, task: str) -> str:
    from urllib.parse import quote

    return json.loads((root / "workspaces/index" / (quote(task, safe="") + ".json")).read_text())["key"]


def cached_artifact(cache: Path, key: str) -> Path:
    return cache / "store" / key[:2] / key


def test_a_fresh_clone_takes_every_artifact_checked_and_builds_nothing(ci, tmp_path):
    clone = sources(tmp_path / "elsewhere" / "clone", ci["signer"])
    pulled = as_reader("cache", "pull", "--cache", ci["cache"], cwd=clone, check=0)
    assert "18 artifacts taken from" in pulled.stdout, pulled.stdout
    built = as_reader("build", "--json", cwd=clone, check=0)
    assert executed(built) == [], built.stderr
    assert json.loads(built.stdout)["up_to_date"] == 18


def test_the_cache_is_read_only_unless_asked_and_written_only_by_a_trusted_builder(ci, tmp_path):
    cache = tmp_path / "other-cache"
    read_only = magpie_in_process(
        "cache", "push", "--cache", cache, cwd=ci["root"], env={"MAGPIE_SIGNING_KEY": CI_KEY}, check=2
    )
    assert read_only.stderr.count("\n") == 1 and "read-only: give --cache-write" in read_only.stderr
    clone = sources(tmp_path / "clone", ci["signer"])
    as_reader("cache", "pull", "--cache", ci["cache"], cwd=clone, check=0)
    untrusted = as_reader("cache", "push", "--cache", cache, "--cache-write", cwd=clone, check=2)
    assert untrusted.stderr.count("\n") == 1, untrusted.stderr
    assert "is not in [store] trusted_signers" in untrusted.stderr
    assert not cache.exists()  # nothing written before the refusal


def test_a_cache_that_is_no_folder_is_one_line(ci, tmp_path):
    clone = sources(tmp_path / "clone", ci["signer"])
    remote = as_reader("build", "--cache", "s3://bucket/magpie", cwd=clone, check=2)
    assert remote.stderr.count("\n") == 1 and "only a folder is supported" in remote.stderr, remote.stderr


def test_a_forged_artifact_in_the_cache_is_named_and_built_here(ci, tmp_path):
    cache = shutil.copytree(ci["cache"], tmp_path / "cache")
    forged = cached_artifact(cache, key_of(ci["root"], "correctness:k1/a"))
    result = json.loads((forged / "result.json").read_text())
    result["correctness_state"] = "FAILURE"
    data = json.dumps(result).encode()
    (forged / "result.json").write_bytes(data)
    digest = json.loads((forged / ".digest.json").read_text())
    digest["files"]["result.json"] = [len(data), hashlib.sha256(data).hexdigest()]
    (forged / ".digest.json").write_text(json.dumps(digest))
    clone = sources(tmp_path / "clone", ci["signer"])
    built = as_reader("build", "--json", "--cache", cache, cwd=clone, check=0)
    assert (
        f"cache: artifact of correctness:k1/a in {cache} not used (signature does not match its task, key and "
        f"files); building it here"
    ) in built.stderr
    assert "correctness:k1/a" in executed(built)
    assert "compile:k1/a" not in executed(built)  # the rest came from the cache
    (kernel,) = [k for k in json.loads(built.stdout)["kernels"] if k["kernel"] == "k1"]
    assert {i["implementation"]: i["correctness_state"] for i in kernel["implementations"]}["a"] == "SUCCESS"


def test_a_link_in_the_cache_is_refused_before_anything_is_read_through_it(ci, tmp_path):
    cache = shutil.copytree(ci["cache"], tmp_path / "cache")
    linked = cached_artifact(cache, key_of(ci["root"], "compile:k2/c"))
    (linked / "result.json").unlink()
    (linked / "result.json").symlink_to("/etc/passwd")
    clone = sources(tmp_path / "clone", ci["signer"])
    pulled = as_reader("cache", "pull", "--cache", cache, cwd=clone, check=1)
    assert "cache: artifact of compile:k2/c" in pulled.stderr and "result.json is not a plain file" in pulled.stderr
    assert "13 artifacts taken" in pulled.stdout  # its 4 dependents: keys unknown without it


def test_an_untrusted_builders_artifact_put_into_the_cache_is_treated_as_absent(ci, tmp_path):
    """Anyone who can write the folder can put artifacts there: signed by a key nobody trusts,
    they are not used, the line naming the signer."""
    stranger_key = secrets.token_hex(32)
    edited = "def kernel(x):\n    return x * 1 + 0\n"
    stranger = sources(tmp_path / "stranger", ci["signer"])
    (stranger / "k2/c.py").write_text(edited)
    as_reader("build", "compile:k2/c", cwd=stranger, key=stranger_key, check=0)
    cache = shutil.copytree(ci["cache"], tmp_path / "cache")
    key = key_of(stranger, "compile:k2/c")
    shutil.copytree(stranger / "workspaces/store" / key[:2] / key, cached_artifact(cache, key))
    clone = sources(tmp_path / "clone", ci["signer"])
    (clone / "k2/c.py").write_text(edited)
    built = as_reader("build", "--json", "--cache", cache, cwd=clone, check=0)
    assert (
        f"cache: artifact of compile:k2/c in {cache} not used (signed by {signer(stranger_key, tmp_path)}, "
        f"not a trusted signer)"
    ) in built.stderr
    assert "compile:k2/c" in executed(built)


def test_a_build_with_cache_write_puts_what_it_built_and_the_setting_names_the_cache(ci, tmp_path):
    cache = tmp_path / "fresh-cache"
    builder = sources(tmp_path / "builder", ci["signer"])
    manifest = builder / "magpie.toml"
    manifest.write_text(manifest.read_text().replace("[store]\n", '[store]\ncache = "../fresh-cache"\n', 1))
    (builder / "k1/b.py").write_text("def kernel(x):\n    return x * 1 * 1\n")  # b's tasks are not in any cache
    built = magpie_in_process(
        "build", "--json", "--cache-write", cwd=builder, env={"MAGPIE_SIGNING_KEY": CI_KEY}, check=0
    )
    assert "cache: 18 artifacts put into" in built.stderr, built.stderr
    reader = sources(tmp_path / "reader", ci["signer"])
    (reader / "k1/b.py").write_text("def kernel(x):\n    return x * 1 * 1\n")
    assert executed(as_reader("build", "--json", "--cache", cache, cwd=reader, check=0)) == []
