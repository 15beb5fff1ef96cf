"""Code under test changes no file's metadata outside its scratch folder: from inside its worker
a candidate tries every system call that changes a mode, an owner, a time or an extended
attribute on a project file, a competitor's source and a root-owned file outside the project
(on 872a590 a root-owned file in /opt went from mode 600 to 4777, the spec and the other
candidates got mtime 0, and xattrs outlived `magpie clean`); the same calls on a file of its
own scratch folder must all still work."""

import json
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import build_json, relu2_project

from magpie import sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this host")

# Every family, each call made as the libc wrapper or, for the calls Python has no wrapper of,
# the raw system call (x86-64 numbers; aarch64 has no chmod, utime, utimes, futimesat).
TAMPERER = '''
import ctypes, os, sys, tempfile

import torch

TARGETS = {targets!r}
RAW = {raw!r}
libc = ctypes.CDLL(None, use_errno=True)


def raw(name, *args):
    if libc.syscall(RAW[name], *args) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def timevals():
    return (ctypes.c_long * 4)(0, 0, 0, 0)


def calls(path):
    """name -> what changes path's metadata that way (to what it is now where that is no change)."""
    st = os.stat(path)
    mode = (st.st_mode & 0o7777) ^ 0o077  # a setuid bit is refused everywhere: tests/test_sandbox_setuid.py
    own = {{
        "chmod": lambda: os.chmod(path, mode),
        "fchmod": lambda: _with_fd(path, lambda fd: os.fchmod(fd, mode)),
        "fchmodat": lambda: os.chmod(path, mode, follow_symlinks=True),
        "fchmodat2": lambda: raw("fchmodat2", -100, path.encode(), mode, 0x100),
        "chown": lambda: os.chown(path, st.st_uid, st.st_gid),
        "lchown": lambda: os.lchown(path, st.st_uid, st.st_gid),
        "fchown": lambda: _with_fd(path, lambda fd: os.fchown(fd, st.st_uid, st.st_gid)),
        "fchownat": lambda: raw("fchownat", -100, path.encode(), st.st_uid, st.st_gid, 0),
        "utimensat": lambda: os.utime(path, (0, 0)),
        "futimens": lambda: _with_fd(path, lambda fd: os.utime(fd, (0, 0))),
        "utime": lambda: raw("utime", path.encode(), (ctypes.c_long * 2)(0, 0)),
        "utimes": lambda: raw("utimes", path.encode(), timevals()),
        "futimesat": lambda: raw("futimesat", -100, path.encode(), timevals()),
        "setxattr": lambda: os.setxattr(path, "user.magpie", b"tampered"),
        "lsetxattr": lambda: os.setxattr(path, "user.magpie_l", b"tampered", follow_symlinks=False),
        "fsetxattr": lambda: _with_fd(path, lambda fd: os.setxattr(fd, "user.magpie_f", b"tampered")),
        "removexattr": lambda: os.removexattr(path, "user.magpie"),
    }}
    return {{name: call for name, call in own.items() if name not in RAW or RAW[name] is not None}}


def _with_fd(path, action):
    fd = os.open(path, os.O_RDONLY)
    try:
        action(fd)
    finally:
        os.close(fd)


def attempt(where, path):
    for name, call in calls(path).items():
        try:
            call()
            print("SUCCEEDED", where, name, flush=True)
        except Exception as err:
            print("failed", where, name, type(err).__name__, err, flush=True)


own = os.path.join(tempfile.gettempdir(), "own-file")
with open(own, "w") as out:
    out.write("mine")
attempt("own", own)
for where, path in TARGETS.items():
    attempt(where, path)


def kernel(x):
    return torch.relu(x) * 2.0
'''

# Raw system call numbers (x86-64; None where the architecture has no such call).
RAW = {
    "x86_64": {"fchmodat2": 452, "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261},
    "aarch64": {"fchmodat2": 452, "fchownat": 54, "utime": None, "utimes": None, "futimesat": None},
}


def metadata(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, sorted(os.listxattr(path))


@pytest.fixture(scope="module")
def tampered(tmp_path_factory):
    return tamper_build(tmp_path_factory.mktemp("tampered"), "cpu")


def tamper_build(root: Path, device: str):
    """The tamperer and an honest rival built on device: the project, the build's JSON, the
    targets, their metadata before and after, and what each call did (`tried`)."""
    token = uuid.uuid4().hex[:12]
    targets = {
        "project": str(root / "spec.py"),
        "manifest": str(root / "magpie.toml"),
        "competitor": str(root / "rival.py"),
    }
    outside = None
    if os.geteuid() == 0 and os.access("/opt", os.W_OK):  # a root-owned file outside the project, mode 600
        outside = Path("/opt") / f"magpie-victim-{token}"
        outside.write_text("root's")
        outside.chmod(0o600)
        targets["outside"] = str(outside)
    (root / "tamperer.py").write_text(TAMPERER.format(targets=targets, raw=RAW.get(platform.machine(), {})))
    (root / "rival.py").write_text("import torch\n\n\ndef kernel(x):\n    return torch.relu(x) * 2.0\n")
    relu2_project(root, ["tamperer", "rival"], shapes="[[33, 65]]", defaults="timeout_s = 60", device=device)
    before = {where: metadata(Path(path)) for where, path in targets.items()}
    try:
        result = build_json(root, "-j", "1")
        after = {where: metadata(Path(path)) for where, path in targets.items()}
    finally:
        if outside is not None:
            outside.unlink()
    logs = list((root / "workspaces/store").glob("*/*/worker-tamperer.log"))
    lines = [line.split() for log in logs for line in log.read_text().splitlines()]
    tried: dict[tuple[str, str], list[str]] = {}
    for words in lines:
        if words[:1] in (["SUCCEEDED"], ["failed"]):
            tried.setdefault((words[1], words[2]), []).append(" ".join(words))
    return root, result, targets, before, after, tried


def test_no_call_changes_a_project_file_a_competitors_or_one_outside_the_project(tampered):
    _, _, targets, before, after, tried = tampered
    assert before == after
    names = {name for _, name in tried}
    assert {"chmod", "fchmodat", "chown", "utimensat", "setxattr", "removexattr"} <= names, sorted(names)
    for where in targets:
        for name in names:
            outcomes = tried.get((where, name))
            assert outcomes and all(o.startswith("failed") for o in outcomes), (where, name, outcomes)


def test_its_own_scratch_folder_stays_fully_usable(tampered):
    _, _, _, _, _, tried = tampered
    own = {name: outcomes for (where, name), outcomes in tried.items() if where == "own"}
    # removexattr runs after setxattr made the attribute, so it succeeds where setxattr did
    assert own and all(o.startswith("SUCCEEDED") for outcomes in own.values() for o in outcomes), own


def test_the_competitor_it_tried_to_sabotage_is_judged_correct(tampered):
    root, result, _, _, _, _ = tampered
    assert result["failed"] == []
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    rows = {r["implementation"]: r for r in report["results"]}
    assert rows["rival"]["correctness_state"] == "SUCCESS"
    assert rows["tamperer"]["correctness_state"] == "SUCCESS"


@pytest.mark.gpu
def test_no_call_changes_metadata_outside_its_scratch_on_the_gpu_either(tmp_path):
    """With CUDA in the worker (its device nodes on a read-only /dev, its own /dev/shm and
    /proc writable): the same calls fail outside its scratch folder, work inside it, and both
    candidates are judged."""
    root, result, targets, before, after, tried = tamper_build(tmp_path, "cuda")
    assert before == after
    assert result["failed"] == []
    for (where, name), outcomes in tried.items():
        expected = "SUCCEEDED" if where == "own" else "failed"
        assert all(o.startswith(expected) for o in outcomes), (where, name, outcomes)
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    states = {r["implementation"]: r["correctness_state"] for r in report["results"]}
    assert states["tamperer"] == states["rival"] == "SUCCESS", states


def test_a_command_in_the_sandbox_changes_no_metadata_but_in_its_own_folders(tmp_path):
    """The same defence for a compile command or a command testcase (`python -m magpie.sandbox`):
    the project it reads is read-only to it, its own folder is not, whoever owns the files."""
    scratch, project = tmp_path / "scratch", tmp_path / "project"
    scratch.mkdir()
    project.mkdir()
    (project / "source.py").write_text("x = 1\n")
    before = metadata(project / "source.py")
    policy = sandbox.Policy(write=[str(scratch)], read=[str(project)])
    script = (
        f"chmod 777 {project}/source.py || echo refused; touch -d @0 {project}/source.py || echo refused; "
        f"touch {scratch}/own && chmod 700 {scratch}/own && touch -d @0 {scratch}/own && echo own-ok"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "magpie.sandbox", json.dumps(policy.to_json()), "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["refused", "refused", "own-ok"], (proc.stdout, proc.stderr)
    assert metadata(project / "source.py") == before
    own = os.stat(scratch / "own")
    assert own.st_mode & 0o777 == 0o700 and own.st_mtime_ns == 0
