"""The store cannot be forged by whoever can write it (a CI cache): every artifact is signed
with a key kept outside the store, over its task, key and files' digests, and the no-op
build's stamps are MAC'd with it. A forged, moved, unsigned or untrusted artifact is rebuilt
with one line; one signed by a trusted signer is used; `magpie verify` reports what fails.
The CLI runs in this process (`magpie_in_process`), each call with its own key folder and
secret, as a process of its own would."""

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import COMMAND_PROJECT, magpie_in_process, write

# A candidate whose testcase fails, and a testcase that fails wherever the signing secret reached it.
FAILING_B = (
    COMMAND_PROJECT["magpie.toml"]
    .replace("command = \"python -c 'import sys; sys.exit(0)'\"", "command = 'test \"$MAGPIE_IMPL_ID\" != b'", 1)
    .replace("command = \"python -c 'import sys; sys.exit(0)'\"", "command = 'test -z \"$MAGPIE_SIGNING_KEY\"'", 1)
)
KEY_B = "b7" * 32  # a CI secret
BAD = "signature does not match its task, key and files"
REBUILT = "store: artifact of {task} was modified after it was written ({problem}); rebuilding it"
UNSIGNED = (
    "store: artifact of {task} is not signed (written by an older magpie, or its signature removed); rebuilding it"
)


def env_of(config: Path, secret: str = "") -> dict:
    """The key from the config folder's key file, or from the secret where given."""
    return {"XDG_CONFIG_HOME": str(config), "MAGPIE_SIGNING_KEY": secret}


def build(root: Path, env: dict, check: int = 0):
    proc = magpie_in_process("build", "--json", cwd=root, env=env, check=check)
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout), [line for line in proc.stderr.splitlines() if line.startswith("store:")]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The command project with k1/b failing, built once signed by key A (a key file made on first use)."""
    base = tmp_path_factory.mktemp("signed")
    root, config = base / "project", base / "config-a"
    write(root, {**COMMAND_PROJECT, "magpie.toml": FAILING_B})
    summary, lines = build(root, env_of(config))
    assert summary["failed"] == [] and lines == []
    return root, config


@pytest.fixture
def project(built, tmp_path) -> Path:
    """A copy of the built project (a cache restored elsewhere), its snapshot renewed by a no-op build."""
    root = tmp_path / "project"
    shutil.copytree(built[0], root, symlinks=True)
    assert up_to_date(root, env_of(built[1]))
    return root


def up_to_date(root: Path, env: dict) -> bool:
    summary, lines = build(root, env)
    return summary["executed"] == [] and summary["failed"] == [] and lines == []


def artifact(root: Path, task: str) -> Path:
    key = index(root, task)["key"]
    return root / "workspaces/store" / key[:2] / key


def index(root: Path, task: str) -> dict:
    return json.loads((root / "workspaces/index" / (quote(task, safe="") + ".json")).read_text())


def rows(path: Path) -> dict:
    return {row["implementation"]: row["correctness_state"] for row in json.loads(path.read_text())["results"]}


def stat_of(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def forge(root: Path, task: str, change) -> None:
    """What a writer of the workspace can do: a file rewritten, and every record of its digest
    and stat with it (the artifact's digests, its index record, the no-op build's stamps)."""
    folder = artifact(root, task)
    result = folder / "result.json"
    result.write_text(change(result.read_text()))
    data = result.read_bytes()
    digest = [len(data), hashlib.sha256(data).hexdigest()]
    recorded = json.loads((folder / ".digest.json").read_text())
    recorded["files"]["result.json"] = digest
    (folder / ".digest.json").write_text(json.dumps(recorded))
    record = index(root, task)
    record["files"]["result.json"] = digest
    (root / "workspaces/index" / (quote(task, safe="") + ".json")).write_text(json.dumps(record))

    snapshot = root / "workspaces/graph-snapshot.json"
    text = snapshot.read_text()
    head, body = ("", text) if text.startswith("{") else text.split("\n", 1)
    saved = json.loads(body)
    for stamp in saved["tasks"][task]["stamp"]:
        if stamp[0] == "result.json":
            stamp[1:] = stat_of(result)
    snapshot.write_text((head + "\n" if head else "") + json.dumps(saved))


def test_a_verdict_forged_with_its_digests_and_stamps_is_rebuilt_not_published(project, built):
    published = project / "workspaces/reports/k1/compare_report.json"
    assert rows(published)["b"] == "FAILED"
    forge(project, "comparison:k1", lambda text: text.replace('"FAILED"', '"SUCCESS"'))
    # and the published copy, with the stat its ledger records: trusted as published while the stamps hold
    shutil.copy(artifact(project, "comparison:k1") / "result.json", published)
    ledger_path = project / "workspaces/reports/.published.json"
    ledger = json.loads(ledger_path.read_text())
    ledger["comparison:k1"] = {
        "key": json.dumps(
            [artifact(project, "comparison:k1").name, stat_of(artifact(project, "comparison:k1") / ".digest.json")]
        ),
        "files": {"k1/compare_report.json": stat_of(published)},
    }
    ledger_path.write_text(json.dumps(ledger))

    summary, lines = build(project, env_of(built[1]))
    assert lines == [REBUILT.format(task="comparison:k1", problem=BAD)]
    assert summary["executed"][0] == "comparison:k1"  # then what reads it (the report)
    assert rows(published)["b"] == "FAILED"
    assert magpie_in_process("verify", cwd=project, env=env_of(built[1]), check=0).stdout.startswith("magpie: all ")


def test_a_signature_moved_with_its_artifact_to_another_task_does_not_hold(project, built):
    passing, failing = artifact(project, "correctness:k1/a"), artifact(project, "correctness:k1/b")
    shutil.rmtree(failing)
    shutil.copytree(passing, failing)
    record = index(project, "correctness:k1/b")
    record["files"] = index(project, "correctness:k1/a")["files"]
    (project / "workspaces/index" / (quote("correctness:k1/b", safe="") + ".json")).write_text(json.dumps(record))

    verify = json.loads(magpie_in_process("verify", "--json", cwd=project, env=env_of(built[1]), check=1).stdout)
    assert [(bad["task"], bad["problem"]) for bad in verify["bad"]] == [("correctness:k1/b", BAD)]
    summary, lines = build(project, env_of(built[1]))
    assert "correctness:k1/b" in summary["executed"] and len(lines) == 1
    assert json.loads((failing / "result.json").read_text())["correctness_state"] == "FAILED"


def test_a_tampered_signature_file_alone_is_reported_and_rebuilt(project, built):
    signature_file = artifact(project, "correctness:k2/c") / ".signature.json"
    signed = json.loads(signature_file.read_text())
    signed["signature"] = ("0" if signed["signature"][0] != "0" else "1") + signed["signature"][1:]
    signature_file.write_text(json.dumps(signed))

    verify = magpie_in_process("verify", cwd=project, env=env_of(built[1]), check=1).stdout
    assert "bad  correctness:k2/c " in verify and f"({BAD})" in verify
    summary, lines = build(project, env_of(built[1]))
    assert lines == [REBUILT.format(task="correctness:k2/c", problem=BAD)]
    assert summary["executed"][0] == "correctness:k2/c"


def test_an_unsigned_artifact_is_rebuilt(project, built):
    (artifact(project, "correctness:k1/a") / ".signature.json").unlink()
    summary, lines = build(project, env_of(built[1]))
    assert lines == [UNSIGNED.format(task="correctness:k1/a")]
    assert summary["executed"][0] == "correctness:k1/a"


def test_artifacts_of_an_untrusted_signer_are_rebuilt_and_of_a_trusted_one_used(project, built, tmp_path):
    signer_a = magpie_in_process("key", cwd=project, env=env_of(built[1]), check=0).stdout.strip()
    assert signer_a.startswith("ed25519:") and len(signer_a) == len("ed25519:") + 64
    assert json.loads((artifact(project, "report") / ".signature.json").read_text())["signer"] == signer_a
    key_b = json.loads(magpie_in_process("key", "--json", cwd=project, env=env_of(tmp_path, KEY_B), check=0).stdout)
    assert key_b["source"] == "the environment" and key_b["signer"] != signer_a

    trusting = tmp_path / "trusting"
    shutil.copytree(project, trusting, symlinks=True)
    manifest = trusting / "magpie.toml"
    manifest.write_text(f'[store]\ntrusted_signers = ["{signer_a}"]\n\n' + manifest.read_text())
    assert up_to_date(trusting, env_of(tmp_path, KEY_B))
    magpie_in_process("verify", cwd=trusting, env=env_of(tmp_path, KEY_B), check=0)

    verify = json.loads(magpie_in_process("verify", "--json", cwd=project, env=env_of(tmp_path, KEY_B), check=1).stdout)
    assert {bad["problem"] for bad in verify["bad"]} == {f"signed by {signer_a}, not a trusted signer"}
    plan = json.loads(
        magpie_in_process("build", "--dry-run", "--json", cwd=project, env=env_of(tmp_path, KEY_B), check=0).stdout
    )
    assert {"task": "correctness:k1/a", "why": f"signed by {signer_a}, not a trusted signer"} in plan["would_run"]
    assert len(verify["bad"]) == verify["checked"] == 18
    summary, lines = build(project, env_of(tmp_path, KEY_B))
    assert len(summary["executed"]) == len(lines) == 18 and summary["failed"] == []  # re-judged here
    assert lines[0].endswith(
        f"is signed by {signer_a}, not a trusted signer (magpie key prints a machine's "
        f"signer; trust one with [store] trusted_signers in magpie.toml); rebuilding it"
    )
    assert rows(project / "workspaces/reports/k1/compare_report.json")["b"] == "FAILED"
    # k2's testcase fails wherever MAGPIE_SIGNING_KEY reached it
    assert rows(project / "workspaces/reports/k2/compare_report.json")["c"] == "SUCCESS"
    assert json.loads((artifact(project, "report") / ".signature.json").read_text())["signer"] == key_b["signer"]


def test_a_signer_trusted_in_the_users_file_is_used(project, built, tmp_path):
    signer_a = magpie_in_process("key", cwd=project, env=env_of(built[1]), check=0).stdout.strip()
    config = tmp_path / "config-b"
    (config / "magpie").mkdir(parents=True)
    (config / "magpie/trusted-signers").write_text(f"# the CI builders\n{signer_a}\n")
    assert up_to_date(project, env_of(config, KEY_B))
    (config / "magpie/trusted-signers").write_text("# nobody\n")  # trusting fewer: stamps no longer stand
    summary, lines = build(project, env_of(config, KEY_B))
    assert len(summary["executed"]) == len(lines) == 18
    (config / "magpie/trusted-signers").write_text("ed25519:not-a-key\n")
    proc = magpie_in_process("build", cwd=project, env=env_of(config, KEY_B), check=2)
    assert proc.stderr == (
        f'magpie: {config}/magpie/trusted-signers: line 1: not a signer: give one "ed25519:" '
        f"and 64 lowercase hex digits a line (what `magpie key` prints on the machine to trust)\n"
    )


def test_the_key_file_is_made_private_and_refused_once_others_can_read_it(tmp_path):
    config = tmp_path / "config"
    signer = magpie_in_process("key", cwd=tmp_path, env=env_of(config), check=0).stdout.strip()
    key_file = config / "magpie/signing-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert magpie_in_process("key", cwd=tmp_path, env=env_of(config), check=0).stdout.strip() == signer  # made once
    key_file.chmod(0o644)
    proc = magpie_in_process("key", cwd=tmp_path, env=env_of(config), check=2)
    assert (
        proc.stderr.startswith(
            f"magpie: {key_file}: the store's signing key must be yours and readable by you alone (mode 644"
        )
        and proc.stderr.count("\n") == 1
    )
    proc = magpie_in_process("key", cwd=tmp_path, env=env_of(config, "abc"), check=2)
    assert proc.stderr.startswith("magpie: the environment variable MAGPIE_SIGNING_KEY: not an ed25519 key")


def test_a_bad_trusted_signer_in_the_manifest_is_one_line(command_project, tmp_path):
    manifest = command_project / "magpie.toml"
    manifest.write_text('[store]\ntrusted_signers = ["ed25519:ABC"]\n\n' + manifest.read_text())
    proc = magpie_in_process("build", cwd=command_project, env=env_of(tmp_path), check=2)
    assert "store.trusted_signers" in proc.stderr and "64 lowercase hex digits" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_ci_secret_leaves_the_environment_of_a_library_caller_too(monkeypatch, tmp_path):
    """dodo.py loads a project without the CLI: the store takes the secret before any process starts."""
    from magpie.store import Store, signing

    monkeypatch.setattr(signing, "_secret", [])  # this process's key, as it was, back after the test
    monkeypatch.setattr(signing, "_from_environment", [False])
    monkeypatch.setenv("MAGPIE_SIGNING_KEY", KEY_B)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    Store(tmp_path / "workspaces")
    assert "MAGPIE_SIGNING_KEY" not in os.environ
    assert signing.secret() == bytes.fromhex(KEY_B) and signing.secret_from_environment()
    assert not (tmp_path / "magpie").exists()  # no key file made where the secret was given
