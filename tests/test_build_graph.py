"""The build graph: only stale artifacts rebuild, a killed build loses nothing finished,
and a copied store is a cache hit in a fresh clone. The command project is built once for the
module (`built_command_project`), and the CLI runs in this process, where a test checks only its
exit code, output and files; a process of its own where that is the point (a kill, a terminal,
an environment that must reach doit's start, the imports a no-op build makes)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, REPO, magpie, magpie_in_process, relu2_project, write

ALL_K1 = {"compile:k1/a", "correctness:k1/a", "timing:k1/a", "comparison:k1", "report"}


def dry_run(cwd) -> dict:
    return json.loads(magpie_in_process("build", "--dry-run", "--json", cwd=cwd, check=0).stdout)


def build_json(cwd, *args) -> dict:
    return json.loads(magpie_in_process("build", "--json", *args, cwd=cwd, check=0).stdout)


@pytest.fixture(scope="module")
def first_build(tmp_path_factory) -> tuple[Path, dict]:
    """The command project after its first build, and that build's summary."""
    root = tmp_path_factory.mktemp("built") / "project"
    write(root, COMMAND_PROJECT)
    return root, build_json(root)


@pytest.fixture
def built_command_project(first_build, tmp_path) -> Path:
    """A copy of the built command project (its store and reports) for a test to change."""
    return Path(shutil.copytree(first_build[0], tmp_path / "project", symlinks=True))


def test_first_build_runs_everything_then_nothing(first_build):
    root, first = first_build
    assert len(first["executed"]) == 3 * 5 + 2 + 1 and first["failed"] == []
    assert build_json(root)["executed"] == []
    report = json.loads((root / "workspaces/reports/k1/compare_report.json").read_text())
    assert {r["implementation"] for r in report["results"]} == {"base", "a", "b"}
    assert all(r["correctness_state"] == "SUCCESS" for r in report["results"])


def test_a_doit_plugin_another_package_installs_has_no_part_in_a_build(command_project, tmp_path):
    """doit looks up every installed package's doit commands, loaders, backends and reporters
    on each run, and one of the same name wins over its own: a package that names its command
    `run` (or its backend as magpie's) runs its code in every build, and scanning every
    package's metadata four times took 0.12 s a build on the H200's image. magpie's builds take
    none; plain doit, beside it, runs the planted one."""
    site = tmp_path / "site"
    (site / "hijack-1.0.dist-info").mkdir(parents=True)
    (site / "hijack-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: hijack\nVersion: 1.0\n")
    (site / "hijack-1.0.dist-info" / "entry_points.txt").write_text("[doit.COMMAND]\nrun = magpie_test_hijack:Hijack\n")
    (site / "magpie_test_hijack.py").write_text(
        "import os\nopen(os.environ['HIJACK_MARKER'], 'a').write('imported\\n')\n\n"
        "from doit.cmd_base import Command\n\n\nclass Hijack(Command):\n    name = 'run'\n"
    )
    marker = tmp_path / "imported"
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "HIJACK_MARKER": str(marker)}
    # a process of its own: PYTHONPATH must be what the interpreter starts with, where doit looks
    magpie("build", cwd=command_project, env=env, check=0)
    assert not marker.exists()
    (tmp_path / "dodo.py").write_text("def task_nothing():\n    return {'actions': []}\n")
    subprocess.run([sys.executable, "-m", "doit", "run"], cwd=tmp_path, env={**os.environ, **env}, capture_output=True)
    assert marker.read_text() == "imported\n"


def test_editing_one_candidate_rebuilds_only_its_tasks(built_command_project):
    command_project = built_command_project
    (command_project / "k1/a.py").write_text("def kernel(x):\n    return x + 0.0\n")
    plan = dry_run(command_project)
    assert {item["task"] for item in plan["would_run"]} == ALL_K1
    why = {item["task"]: item["why"] for item in plan["would_run"]}
    assert why["compile:k1/a"] == "k1/a.py changed"
    assert "correctness:k1/a rebuilt" in why["comparison:k1"]
    assert set(build_json(command_project)["executed"]) == ALL_K1


EDITED_A = {"compile:relu2/a", "correctness:relu2/a", "timing:relu2/a", "comparison:relu2", "report"}
QUICK_TIMING = "warmup_ms = 1\nbudget_ms = 10\nrounds = 2"


def test_editing_one_timed_candidate_reruns_none_of_the_others(tmp_path):
    """Each candidate is timed beside the baseline, whose own timing chooses the method for the
    set: editing a candidate re-runs its check and timing (and the comparison and report above
    them), not the baseline's timing, nor any task of another candidate."""
    for name in ("a", "b"):
        shutil.copy(REPO / "tests/fixtures/adversarial/good.py", tmp_path / f"{name}.py")
    relu2_project(tmp_path, ["a", "b"], shapes="[[8, 16]]", defaults="trials = 1", timing=QUICK_TIMING)
    first = build_json(tmp_path, "-j", "2")
    assert first["failed"] == [] and {"timing:relu2/good", "timing:relu2/b"} <= set(first["executed"])
    with open(tmp_path / "a.py", "a") as source:
        source.write("# edited: the kernel is the same\n")
    assert set(build_json(tmp_path, "-j", "2")["executed"]) == EDITED_A


def test_compare_again_into_its_folder_reruns_only_the_edited_candidate(tmp_path):
    """`magpie compare` into the folder of an earlier one (its store kept) after one source changed."""
    shutil.copy(REPO / "tests/fixtures/adversarial/spec.py", tmp_path / "spec.py")
    for name in ("good", "a", "b"):
        shutil.copy(REPO / "tests/fixtures/adversarial/good.py", tmp_path / f"{name}.py")
    args = [
        "compare",
        "good.py",
        "a.py",
        "b.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "spec.py",
        "--shapes",
        "8x16",
        "--budget-ms",
        "10",
        "-j",
        "2",
        "-o",
        "out",
    ]
    magpie_in_process(*args, cwd=tmp_path, check=0)
    with open(tmp_path / "a.py", "a") as source:
        source.write("# edited: the kernel is the same\n")
    magpie_in_process(*args, cwd=tmp_path, check=0)
    built: dict[str, int] = {}
    for result in (tmp_path / "out/workspace/store").glob("*/*/result.json"):
        task = json.loads(result.read_text())["task"]
        built[task] = built.get(task, 0) + 1
    assert {task for task, count in built.items() if count > 1} == {
        name.replace("relu2", "compare") for name in EDITED_A
    }
    assert "timing:compare/good" in built and "timing:compare/b" in built


def test_touch_without_change_runs_nothing(built_command_project):
    command_project = built_command_project
    time.sleep(0.01)
    for path in command_project.rglob("*.py"):
        os.utime(path)
    os.utime(command_project / "magpie.toml")
    assert build_json(command_project)["executed"] == []


def test_changing_a_kernel_setting_reruns_that_kernel_only(built_command_project):
    command_project = built_command_project
    manifest = command_project / "magpie.toml"
    manifest.write_text(
        manifest.read_text().replace('id = "k2"\ntype = "pytorch"\n', 'id = "k2"\ntype = "pytorch"\ntimeout_s = 30\n')
    )
    executed = set(build_json(command_project)["executed"])
    assert executed == {f"{rule}:k2/{impl}" for rule in ("correctness", "timing") for impl in ("base", "c")} | {
        "comparison:k2",
        "report",
    }


def test_clean_one_kernel_and_all(built_command_project):
    command_project = built_command_project
    magpie_in_process("clean", "k2", cwd=command_project, check=0)
    plan = {item["task"] for item in dry_run(command_project)["would_run"]}
    assert plan == {f"{rule}:k2/{impl}" for rule in ("compile", "correctness", "timing") for impl in ("base", "c")} | {
        "comparison:k2",
        "report",
    }
    magpie_in_process("clean", "--all", cwd=command_project, check=0)
    assert not (command_project / "workspaces/store").exists()
    assert len(dry_run(command_project)["would_run"]) == 18


def test_unknown_target_is_one_line(command_project):
    proc = magpie_in_process("build", "nope", cwd=command_project)
    assert proc.returncode == 2 and "no kernel, trace set, benchmark or task named 'nope'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_kill_9_keeps_finished_artifacts(command_project):
    slow = command_project / "magpie.toml"
    slow.write_text(slow.read_text().replace("sys.exit(0)", "import time; time.sleep(0.7)"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "magpie", "build", "--plain"],
        cwd=command_project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    store = command_project / "workspaces/store"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(store.glob("*/[0-9a-f]*"))) < 6:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = [p for p in store.glob("*/[0-9a-f]*")]
    assert 6 <= len(finished) < 18, "the kill should land mid-build"
    for artifact in finished:
        json.loads((artifact / "result.json").read_text())  # whole, never half-written
    stale = {item["task"] for item in dry_run(command_project)["would_run"]}
    assert len(stale) == 18 - len(finished)
    assert set(build_json(command_project)["executed"]) == stale
    assert not list(store.glob("*/.tmp-*"))


def test_fresh_clone_with_copied_store_runs_nothing(built_command_project, tmp_path_factory):
    command_project = built_command_project
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=command_project, check=True)
    subprocess.run([*git, "add", "magpie.toml", "k1", "k2"], cwd=command_project, check=True)
    subprocess.run([*git, "commit", "-qm", "p"], cwd=command_project, check=True)
    clone = tmp_path_factory.mktemp("clone") / "project"
    subprocess.run(["git", "clone", "-q", str(command_project), str(clone)], check=True)
    shutil.copytree(command_project / "workspaces/store", clone / "workspaces/store")
    assert dry_run(clone)["would_run"] == []
    assert build_json(clone)["executed"] == []
    assert (clone / "workspaces/reports/report.html").is_file()


def test_parallel_build_through_the_process_pool(command_project):
    result = build_json(command_project, "-j", "2")
    assert len(result["executed"]) == 18 and result["failed"] == []
    assert build_json(command_project)["executed"] == []


def test_job_processes_take_the_environment_of_the_build_that_made_them(monkeypatch):
    """They are forked from a server that outlives one build: what its environment was then
    (another build's zygote folder, say) must not be what a later build's jobs see."""
    from magpie.execution.executors import LocalProcessExecutor

    for value in ("first build", "second build"):
        monkeypatch.setenv("MAGPIE_PROBE", value)
        executor = LocalProcessExecutor(1)
        try:
            assert executor._pool.submit(os.getenv, "MAGPIE_PROBE").result(timeout=60) == value
        finally:
            executor.shutdown()


def test_jobs_fork_from_the_pool_server_started_before_the_executor():
    """A build starts the pool's server first (`pool.prestart`), so that its imports overlap the
    build's own set-up: the executor made later must fork its processes from that server."""
    from magpie.execution import pool
    from magpie.execution.executors import LocalProcessExecutor

    pool.prestart(2)
    servers = [pid for pid in _children(os.getpid()) if b"multiprocessing.forkserver" in _cmdline(pid)]
    assert len(servers) == 1
    executor = LocalProcessExecutor(1)
    try:
        assert executor._pool.submit(os.getppid).result(timeout=60) == servers[0]
    finally:
        executor.shutdown()


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # a thread that ended since it was listed
            pass
    return children


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended since it was listed
        return b""


def test_noop_build_never_imports_torch(built_command_project):
    command_project = built_command_project
    code = (
        "import sys; from magpie.cli import main; rc = main(['build']); "
        "heavy = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
        "print(rc, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=command_project, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"


def test_project_rule_adds_a_command_artifact(command_project):
    manifest = command_project / "magpie.toml"
    manifest.write_text(
        manifest.read_text()
        + """
[[rule]]
name = "linecount"
scope = "implementation"
types = ["pytorch"]
inputs = ["{impl.source}"]
action = "wc -l {impl.source} > {out}/lines.txt"
"""
    )
    build_json(command_project)
    store = command_project / "workspaces/store"
    counted = list(store.glob("*/*/lines.txt"))
    assert len(counted) == 5
    assert sorted(p.read_text().split()[0] for p in counted) == ["2"] * 5
    (command_project / "k2/c.py").write_text("def kernel(x):\n    y = x\n    return y\n")
    assert "linecount:k2/c" in build_json(command_project)["executed"]
    assert sorted(p.read_text().split()[0] for p in store.glob("*/*/lines.txt")) == ["2"] * 5 + ["3"]


def _on_a_terminal(args: list[str], cwd) -> tuple[int, str]:
    """Run magpie with stdin, stdout and stderr on a pseudo-terminal; its exit code and output."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "magpie", *args],
        cwd=cwd,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when magpie exits
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=300)
    os.close(leader)
    return proc.returncode, output.decode(errors="replace")


def test_progress_is_a_rich_bar_on_a_terminal_and_plain_lines_otherwise(command_project):
    plain = magpie_in_process("build", cwd=command_project, check=0)
    assert "run   compile:k1/a  (never built)" in plain.stderr and "━" not in plain.stderr
    magpie_in_process("clean", "--all", cwd=command_project, check=0)
    code, text = _on_a_terminal(["build"], command_project)
    assert code == 0
    assert "magpie build" in text and "━" in text and "18/18" in text


def test_compare_shows_its_progress_bar_on_a_terminal(tmp_path):
    shutil.copy(REPO / "tests/fixtures/adversarial/spec.py", tmp_path / "spec.py")
    shutil.copy(REPO / "tests/fixtures/adversarial/good.py", tmp_path / "good.py")
    (tmp_path / "twice.py").write_text("import torch\n\ndef kernel(x):\n    return torch.relu(x) + torch.relu(x)\n")
    code, text = _on_a_terminal(
        [
            "compare",
            "good.py",
            "twice.py",
            "--type",
            "pytorch",
            "--entry",
            "kernel",
            "--spec",
            "spec.py",
            "--shapes",
            "8x16",
            "--budget-ms",
            "20",
        ],
        tmp_path,
    )
    assert code == 0, text[-2000:]
    assert "magpie compare" in text and "━" in text and "twice" in text and "device held alone" in text
