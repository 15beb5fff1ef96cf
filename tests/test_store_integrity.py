"""The store is verified on use: an artifact changed after it was written (a verdict
flipped, a file truncated or deleted, a digest missing) is announced in one line and
rebuilt, never trusted; `magpie verify` checks the whole store. The project is built once for
the module, each test tampering with a copy; the CLI runs in this process (`magpie_in_process`)."""

import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import COMMAND_PROJECT, magpie_in_process, write

WARNING = "store: artifact of {task} was modified after it was written ({problem}); rebuilding it"


def build_json(cwd, *args) -> dict:
    return json.loads(magpie_in_process("build", "--json", *args, cwd=cwd, check=0).stdout)


@pytest.fixture(scope="module")
def built_failing_b(tmp_path_factory) -> Path:
    """The command project with candidate k1/b failing its testcase, built once."""
    root = tmp_path_factory.mktemp("failing_b") / "project"
    write(
        root,
        {
            **COMMAND_PROJECT,
            "magpie.toml": COMMAND_PROJECT["magpie.toml"].replace(
                "command = \"python -c 'import sys; sys.exit(0)'\"", "command = 'test \"$MAGPIE_IMPL_ID\" != b'", 1
            ),
        },
    )
    build_json(root)
    assert result(root, "correctness:k1/b")["correctness_state"] == "FAILED"
    return root


@pytest.fixture
def failing_b(built_failing_b, tmp_path) -> Path:
    """A copy of the built project, its snapshot renewed by a no-op build (a copy's files have
    other inodes and times: the no-op path would not trust them as it trusts the build's own)."""
    root = Path(shutil.copytree(built_failing_b, tmp_path / "project", symlinks=True))
    assert build_json(root)["executed"] == []
    return root


def artifact(root: Path, task: str) -> Path:
    key = json.loads((root / "workspaces/index" / (quote(task, safe="") + ".json")).read_text())["key"]
    return root / "workspaces/store" / key[:2] / key


def result(root: Path, task: str) -> dict:
    return json.loads((artifact(root, task) / "result.json").read_text())


def warnings(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("store:")]


def test_a_flipped_verdict_is_found_and_rebuilt(failing_b):
    path = artifact(failing_b, "correctness:k1/b") / "result.json"
    path.write_text(path.read_text().replace('"FAILED"', '"SUCCESS"'))

    verify = magpie_in_process("verify", cwd=failing_b, check=1)
    assert "correctness:k1/b" in verify.stdout and "result.json digest mismatch" in verify.stdout
    plan = json.loads(magpie_in_process("build", "--dry-run", "--json", cwd=failing_b, check=0).stdout)
    assert plan["would_run"][0] == {
        "task": "correctness:k1/b",
        "why": "modified after it was written: result.json digest mismatch",
    }
    # what reads its result follows it (the check run again gives another result); the timing reads only its
    # verdict (a gate), which the dry run takes as kept, and the build re-times it only if the verdict changed
    readers = {"timing:k1/b", "comparison:k1", "report"}
    assert {row["task"] for row in plan["would_run"][1:]} == readers - {"timing:k1/b"}

    proc = magpie_in_process("build", "--json", cwd=failing_b, check=0)
    assert warnings(proc.stderr) == [WARNING.format(task="correctness:k1/b", problem="result.json digest mismatch")]
    executed = json.loads(proc.stdout)["executed"]
    assert executed[0] == "correctness:k1/b" and set(executed[1:]) <= readers
    assert result(failing_b, "correctness:k1/b")["correctness_state"] == "FAILED"
    assert magpie_in_process("verify", cwd=failing_b, check=0).stdout.startswith("magpie: all ")
    assert build_json(failing_b)["executed"] == []


def test_truncated_and_deleted_files_are_rebuilt(failing_b):
    report = artifact(failing_b, "report") / "report.html"
    report.write_bytes(report.read_bytes()[:100])
    (artifact(failing_b, "correctness:k2/c") / "result.json").unlink()

    verify = json.loads(magpie_in_process("verify", "--json", cwd=failing_b, check=1).stdout)
    assert {(bad["task"], bad["problem"]) for bad in verify["bad"]} == {
        ("report", "report.html truncated"),
        ("correctness:k2/c", "result.json missing"),
    }

    proc = magpie_in_process("build", "--json", cwd=failing_b, check=0)
    # the report reads the check that is missing, so it is made again whether or not its own damage is said
    found = set(warnings(proc.stderr))
    assert WARNING.format(task="correctness:k2/c", problem="result.json missing") in found
    assert found <= {
        WARNING.format(task="correctness:k2/c", problem="result.json missing"),
        WARNING.format(task="report", problem="report.html truncated"),
    }
    executed = set(json.loads(proc.stdout)["executed"])  # and what reads the check's new result
    assert {"correctness:k2/c", "report"} <= executed <= {"correctness:k2/c", "timing:k2/c", "comparison:k2", "report"}
    rebuilt = artifact(failing_b, "report") / "report.html"  # under a new key where the comparison's result is new
    assert (failing_b / "workspaces/reports/report.html").read_bytes() == rebuilt.read_bytes()
    assert len(rebuilt.read_bytes()) > 100
    # the truncated report under its old key is read by nothing now; verify may still name it, never the new one
    verify = magpie_in_process("verify", cwd=failing_b, check=None)
    bad = [line for line in verify.stdout.splitlines() if line.startswith("bad ")]
    assert all(line.split()[1] == "report" and line.split()[2] != rebuilt.parent.name[:12] for line in bad), bad


def test_verify_fix_removes_what_is_bad_and_the_build_rebuilds_it(failing_b):
    path = artifact(failing_b, "comparison:k1") / "result.json"
    path.write_text(path.read_text() + " ")
    proc = magpie_in_process("verify", "--fix", cwd=failing_b, check=1)
    assert "comparison:k1" in proc.stdout and "removed" in proc.stdout
    assert not path.exists()
    proc = magpie_in_process("build", "--json", cwd=failing_b, check=0)
    assert warnings(proc.stderr) == []  # removed already: simply missing
    assert json.loads(proc.stdout)["executed"] in (["comparison:k1"], ["comparison:k1", "report"])
    magpie_in_process("verify", cwd=failing_b, check=0)


def test_build_verify_hashes_even_what_the_no_op_path_would_trust(failing_b):
    folder = artifact(failing_b, "correctness:k1/a")
    (folder / ".digest.json").unlink()  # not part of the no-op path's stat check
    index = failing_b / "workspaces/index" / (quote("correctness:k1/a", safe="") + ".json")
    record = json.loads(index.read_text())
    del record["files"]  # as an older magpie wrote it
    index.write_text(json.dumps(record))
    assert build_json(failing_b)["executed"] == []  # trusted by stat, never read
    proc = magpie_in_process("build", "--verify", "--json", cwd=failing_b, check=0)
    assert warnings(proc.stderr) == [
        "store: artifact of correctness:k1/a has no recorded digest (written by an older magpie); rebuilding it"
    ]
    executed = json.loads(proc.stdout)["executed"]  # and what reads the check's new result
    assert executed[0] == "correctness:k1/a" and set(executed[1:]) <= {"timing:k1/a", "comparison:k1", "report"}
    magpie_in_process("verify", cwd=failing_b, check=0)


def test_a_dependency_modified_during_the_build_is_rebuilt_before_it_is_read(failing_b, capsys):
    from magpie.execution.doit_glue import run_task
    from magpie.execution.executors import make_executor
    from magpie.project import Project

    project = Project.load(failing_b / "magpie.toml")
    path = artifact(failing_b, "correctness:k1/b") / "result.json"
    path.write_text(path.read_text().replace('"FAILED"', '"SUCCESS"'))
    project.store.remove(project.tasks["comparison:k1"].key)
    executor = make_executor(1, "inline")
    try:
        run_task(project, executor, "comparison:k1")
    finally:
        executor.shutdown()
    assert capsys.readouterr().err.splitlines() == [
        WARNING.format(task="correctness:k1/b", problem="result.json digest mismatch")
    ]
    assert result(failing_b, "correctness:k1/b")["correctness_state"] == "FAILED"
    rows = {row["implementation"]: row for row in result(failing_b, "comparison:k1")["results"]}
    assert rows["b"]["correctness_state"] == "FAILED"


def test_a_modified_artifact_is_never_published(failing_b, capsys):
    from magpie.report.publish import publish
    from magpie.store import Store

    store = Store(failing_b / "workspaces")
    key = artifact(failing_b, "comparison:k1").name
    published = failing_b / "workspaces/reports/k1/compare_report.json"
    honest = published.read_text()
    published.unlink()
    (store.path(key) / "result.json").write_text(honest.replace('"FAILED"', '"SUCCESS"'))
    assert publish(store, [("comparison:k1", "comparison", "k1", key)]) == ["comparison:k1"]
    assert capsys.readouterr().err.strip() == WARNING.format(
        task="comparison:k1", problem="result.json digest mismatch"
    )
    assert not published.exists() and not store.has(key)
    assert build_json(failing_b)["executed"] in (["comparison:k1"], ["comparison:k1", "report"])
    rows = {row["implementation"]: row for row in json.loads(published.read_text())["results"]}
    assert rows["b"]["correctness_state"] == "FAILED"


def test_an_artifact_rebuilt_under_its_key_is_published_again(tmp_path):
    """A report rebuilt under the same key (its artifact was found modified) renders anew
    (its date, say): the copy under reports/ must be the new one, not the first build's."""
    from magpie.report.publish import publish
    from magpie.store import Store

    store = Store(tmp_path / "workspaces")
    key = "ab" + "0" * 62
    store.commit(key, {}, {"report.html": b"first build", "summary.md": b"first"}, task="report")
    assert publish(store, [("report", "report", None, key)]) == []
    published = tmp_path / "workspaces/reports/report.html"
    assert published.read_bytes() == b"first build"
    store.remove(key)
    store.commit(key, {}, {"report.html": b"rebuilt a minute later", "summary.md": b"again"}, task="report")
    assert publish(store, [("report", "report", None, key)]) == []
    assert published.read_bytes() == b"rebuilt a minute later"
    assert publish(store, [("report", "report", None, key)]) == []  # and once published, left alone
    assert published.read_bytes() == b"rebuilt a minute later"
