import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a failure in CI reproduces anywhere), keep no
# example database in the tree, and set no per-example deadline (this machine is shared and busy).
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_runtest_logreport(report):
    """With MAGPIE_TEST_FAILURES_AT_ONCE set, a failure is written out as it happens: a device
    run cut at its time limit never reaches pytest's summary (`bench/gpu_session.sh tests`)."""
    if report.failed and os.environ.get("MAGPIE_TEST_FAILURES_AT_ONCE"):
        sys.stderr.write(f"\n{report.nodeid} failed ({report.when}):\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()


def pytest_addoption(parser):
    parser.addini(
        "slow_tests",
        "test files and tests (node ids, or their start) left out of the quick subset, -m 'not slow'",
        type="linelist",
    )
    parser.addini(
        "serial_tests",
        "tests (node ids, or their start) that a `-n N` run gives the machine alone: no other test runs meanwhile",
        type="linelist",
    )


@pytest.hookimpl(tryfirst=True, hookwrapper=True)  # outermost: pytest-timeout's clock starts once the turn is taken
def pytest_runtest_protocol(item, nextitem):
    with _turn_on_the_machine(item):
        yield


@contextlib.contextmanager
def _turn_on_the_machine(item):
    """Under xdist, a test of `serial_tests` runs with no other test beside it, and others wait: those
    that start CPU hogs set the load they judge under, and CPU timing read beside another worker's
    build once failed an honest candidate (tests/test_implausible_timing.py). Others share the
    machine (a shared flock); a serial test holds the gate while it waits for them to finish, so
    that none starts meanwhile, then the lock alone (flock prefers no writer by itself)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    alone = item.nodeid.startswith(tuple(item.config.getini("serial_tests")))
    # the folder of this run that every worker's temporary folder is in (pytest keeps the last three)
    run_folder = item.config._tmp_path_factory.getbasetemp().parent
    with open(run_folder / "machine.gate", "a") as gate, open(run_folder / "machine.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # both descriptors' locks end as the files are closed


@pytest.hookimpl(tryfirst=True)  # before -m selects by marks
def pytest_collection_modifyitems(config, items):
    """The tests pyproject.toml names as slow (a whole file, or one test) are marked so, and the
    GPU tests: `-m "not slow"` replaces addopts' `-m "not gpu"`."""
    slow = tuple(config.getini("slow_tests"))
    for item in items:
        if item.nodeid.startswith(slow) or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.slow)
    for item, group in _groups_sharing_a_fixture(items).items():
        item.add_marker(pytest.mark.xdist_group(group))


# Shared fixtures each xdist worker makes for itself: cheap beside the tests that use them (the tiny
# model takes seconds, a real server start with it a minute), and grouping all their users would put
# every serving test on one worker.
MADE_BY_EACH_WORKER = frozenset({"tiny_model"})


def _groups_sharing_a_fixture(items) -> dict:
    """item -> xdist group, for a `-n N --dist loadgroup` run (README): the tests that
    share an instance of a module-, class- or session-scoped fixture of tests/ (a scenario build,
    a server, an image) run on one worker, so that each is made once. A test that shares none
    has no group: xdist hands such tests out one at a time."""
    tests = Path(__file__).resolve().parent
    owner: dict = {}

    def root(key):
        while owner[key] != key:
            owner[key] = owner[owner[key]]
            key = owner[key]
        return key

    shared_by = {}
    for item in items:
        keys = []
        definitions = item._fixtureinfo.name2fixturedefs if hasattr(item, "_fixtureinfo") else {}
        for name in item.fixturenames:
            for definition in definitions.get(name, ()):
                if definition.scope == "function" or (
                    definition.scope == "session" and definition.argname in MADE_BY_EACH_WORKER
                ):
                    continue
                if not Path(definition.func.__code__.co_filename).resolve().is_relative_to(tests):
                    continue
                # a module-scoped fixture is made once per module that uses it, a class-scoped one per class
                where = {"module": item.nodeid.split("::")[0], "class": item.nodeid.rsplit("::", 1)[0]}
                # and a parametrized one once per parameter
                param = getattr(item, "callspec", None) and item.callspec.params.get(definition.argname)
                instance = definition.argname if param is None else f"{definition.argname}={param}"
                keys.append((instance, where.get(definition.scope, definition.baseid)))
        if keys:
            shared_by[item] = keys
            for key in keys:
                owner.setdefault(key, key)
            for key in keys[1:]:
                owner[root(key)] = root(keys[0])
    # xdist reads a group after the test id's last '@', and only where no ']' follows it
    return {
        item: "{1}::{0}".format(*root(keys[0])).replace("[", "(").replace("]", ")") for item, keys in shared_by.items()
    }


def magpie(*args, cwd, check=None, timeout=600, env=None):
    """Run the real CLI in its own process; returns CompletedProcess with text output."""
    proc = subprocess.run(
        [sys.executable, "-m", "magpie", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check is not None and proc.returncode != check:
        raise AssertionError(
            f"magpie {' '.join(map(str, args))} exited {proc.returncode}, expected {check}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def ctrl_c_taken() -> None:
    """A child's `preexec_fn` for tests that send it SIGINT: the default disposition, so that Python
    turns it into KeyboardInterrupt even where the test run was started with SIGINT ignored (a
    background job of a non-interactive shell is, and its children inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def magpie_in_process(*args, cwd, check=None, env=None):
    """The CLI's `main` run in this process, for tests that check only its exit code, output and
    files (a process costs 0.5-1 s of start and imports): cwd, the environment, signal handlers
    and the signing secret it took are put back after; its output and that of the processes it
    starts are captured at the file descriptors, and an exception escaping it is printed as a
    process would, exit 1. Returns a CompletedProcess as `magpie()` does."""
    import signal
    import tempfile
    import traceback

    from magpie.cli import main
    from magpie.store import signing

    argv = list(map(str, args))
    handlers = {
        sig: signal.getsignal(sig) for sig in signal.valid_signals() if sig not in (signal.SIGKILL, signal.SIGSTOP)
    }
    saved_environ, saved_cwd = dict(os.environ), os.getcwd()
    saved_secret, saved_from_environment = list(signing._secret), list(signing._from_environment)
    # as a process of its own would: no secret read yet (an earlier in-process build may have cached one)
    signing._secret[:], signing._from_environment[:] = [], [False]
    saved_streams, saved_fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for stream in saved_streams:
            stream.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = (open(fd, "w", encoding="utf-8", closefd=False) for fd in (1, 2))
        try:
            os.environ.update(env or {})
            os.chdir(cwd)
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse: --help, --version, a bad argument
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.close()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_environ)
            signing._secret[:], signing._from_environment[:] = saved_secret, saved_from_environment
            for sig, handler in handlers.items():
                if handler is not None and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)
        out.seek(0)
        err.seek(0)
        proc = subprocess.CompletedProcess(
            ["magpie", *argv], code, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")
        )
    if check is not None and proc.returncode != check:
        raise AssertionError(
            f"magpie {' '.join(argv)} exited {proc.returncode}, expected {check} (in process)\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def build_json(cwd, *args) -> dict:
    proc = magpie("build", "--json", *args, cwd=cwd, check=0)
    return json.loads(proc.stdout)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


COMMAND_PROJECT = {
    "magpie.toml": """
        [project]
        name = "cmd"

        [[kernel]]
        id = "k1"
        type = "pytorch"
        entry = "kernel"

        [kernel.baseline]
        id = "base"
        source = "k1/base.py"

        [[kernel.candidates]]
        id = "a"
        source = "k1/a.py"

        [[kernel.candidates]]
        id = "b"
        source = "k1/b.py"

        [[kernel.testcases]]
        command = "python -c 'import sys; sys.exit(0)'"

        [[kernel]]
        id = "k2"
        type = "pytorch"
        entry = "kernel"

        [kernel.baseline]
        id = "base"
        source = "k2/base.py"

        [[kernel.candidates]]
        id = "c"
        source = "k2/c.py"

        [[kernel.testcases]]
        command = "python -c 'import sys; sys.exit(0)'"
        """,
    "k1/base.py": "def kernel(x):\n    return x\n",
    "k1/a.py": "def kernel(x):\n    return x + 0\n",
    "k1/b.py": "def kernel(x):\n    return x * 1\n",
    "k2/base.py": "def kernel(x):\n    return x\n",
    "k2/c.py": "def kernel(x):\n    return x - 0\n",
}


# The head of a candidate's source that does work: spin(seconds) spends that much CPU time
# (what a kernel spends: on the CPU a sleep costs none, and a busy machine does not stretch it).
SPIN_SOURCE = """
import time

import torch


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
"""


# What most scenario builds time with: small, and large enough that a broken timing rule
# still shows in the numbers the tests read.
QUICK_TIMING = "warmup_ms = 5\nbudget_ms = 60\nrounds = 3"


def relu2_report(
    root: Path, candidates: list[str], shapes: str, jobs: int = 2, sources: dict | None = None, **project
) -> dict:
    """`relu2_project` (after writing `sources`, name -> code, into root) built with `-j jobs`
    without a failed task: its compare_report.json."""
    for name, text in (sources or {}).items():
        (root / f"{name}.py").write_text(text)
    relu2_project(root, candidates, shapes, **project)
    assert build_json(root, "-j", str(jobs))["failed"] == []
    return json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())


def relu2_project(
    root: Path,
    candidates: list[str],
    shapes: str,
    defaults: str = "",
    device: str = "cpu",
    baseline: str = "good",
    timing: str = QUICK_TIMING,
) -> None:
    """A `relu2` kernel judged by the adversarial fixtures' spec; the baseline and each
    candidate are fixture files of their names (or ones already written into root)."""
    copy_fixtures(root, [baseline, "spec", *candidates])
    table = kernel_table("relu2", baseline, candidates, shapes=shapes)
    (root / "magpie.toml").write_text(project_toml(table, device=device, defaults=defaults, timing=timing))


def copy_fixtures(root: Path, names) -> None:
    """The adversarial fixture files of these names into root, where no file of that name was written."""
    for name in names:
        if not (root / f"{name}.py").exists():
            shutil.copy(FIXTURES / "adversarial" / f"{name}.py", root / f"{name}.py")


def kernel_table(
    kernel_id: str,
    baseline: str,
    candidates=(),
    *,
    shapes: str | None = None,
    spec: str = "spec.py",
    command: str | None = None,
    folder: str = "",
    settings: str = "",
    timing: str = "",
    testcase: str = "",
    candidate_settings: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
) -> str:
    """One pytorch `[[kernel]]` table of magpie.toml whose implementations are NAME.py files (in
    `folder`; `sources` names any elsewhere), judged by `spec` on `shapes` or by `command`;
    `settings` are the kernel's own keys (trials, timeout_s), `candidate_settings` a candidate's,
    `timing` its `[kernel.timing]` (which replaces the defaults' whole)."""
    extra, source = (
        candidate_settings or {},
        {**{name: f"{folder}{name}.py" for name in (baseline, *candidates)}, **(sources or {})},
    )
    lines = [
        f'[[kernel]]\nid = "{kernel_id}"\ntype = "pytorch"\nentry = "kernel"\n{settings}\n',
        f'[kernel.baseline]\nid = "{baseline}"\nsource = "{source[baseline]}"\n',
    ]
    lines += [
        f'[[kernel.candidates]]\nid = "{name}"\nsource = "{source[name]}"\n{extra.get(name, "")}\n'
        for name in candidates
    ]
    judged = f'command = "{command}"' if command else f'spec = "{spec}"\nshapes = {shapes}'
    lines.append(f"[[kernel.testcases]]\n{judged}\n{testcase}\n")
    if timing:
        lines.append(f"[kernel.timing]\n{timing}\n")
    return "\n".join(lines)


def project_toml(
    *kernels: str, name: str = "relu2", device: str = "cpu", defaults: str = "", timing: str = "", project: str = ""
) -> str:
    """magpie.toml: a project of `kernels` (tables made by `kernel_table`) with these defaults."""
    return (
        f'[project]\nname = "{name}"\ndevice = "{device}"\n{project}\n\n[defaults]\n{defaults}\n\n'
        f"[defaults.timing]\n{timing}\n\n" + "\n".join(kernels)
    )


@pytest.fixture
def command_project(tmp_path) -> Path:
    """A fast project: command testcases decide correctness, nothing imports torch."""
    write(tmp_path, COMMAND_PROJECT)
    return tmp_path


# Scenario builds shared by the session: a cold build starts sandboxed workers and times every
# implementation, so each scenario is built once and the tests that only read it share it; a test
# that builds again works on its own copy (`copy_project`: a copied store is up to date).

# Every way of being wrong the adversarial fixtures hold, judged as one kernel beside `good`
# (tests/test_verdicts.py and tests/test_verdict_kinds.py read it), and the outputs of odd forms
# as another (tests/test_odd_outputs.py): one build.
ADVERSARIAL = (
    "raises",
    "aborts",
    "segfaults",
    "hangs",
    "hogs_memory",
    "nan",
    "mutates",
    "unwritten",
    "stale_cache",
    "broadcast",
    "wrong_dtype",
    "syntax_error",
    "fakes_clock",
    "returns_early",
    "degrades",
    "lazy_when_timed",
    "memoizes",
)
ODD_OUTPUTS = ("returns_sparse", "returns_nested", "returns_on_meta", "returns_subclass", "returns_transposed")


@pytest.fixture(scope="session")
def adversarial_reports(tmp_path_factory) -> dict[str, dict]:
    """compare_report.json by kernel: `relu2`, `ADVERSARIAL` on two shapes, 8 s and 4 GiB a
    process (hangs and hogs_memory reach their limits soon); `odd_outputs`, `ODD_OUTPUTS`."""
    root = tmp_path_factory.mktemp("adversarial")
    copy_fixtures(root, ["good", "spec", *ADVERSARIAL, *ODD_OUTPUTS])
    relu2 = kernel_table("relu2", "good", ADVERSARIAL, shapes="[[33, 65], [8, 128]]", settings="timeout_s = 8")
    odd = kernel_table(
        "odd_outputs",
        "good",
        ODD_OUTPUTS,
        shapes="[[33, 65]]",
        settings="timeout_s = 30",
        timing="warmup_ms = 1\nbudget_ms = 20\nrounds = 2",
    )
    (root / "magpie.toml").write_text(project_toml(relu2, odd, defaults="memory_mb = 4096", timing=QUICK_TIMING))
    assert build_json(root, "-j", "2")["failed"] == []
    return {
        kernel: json.loads((root / f"workspaces/reports/{kernel}/compare_report.json").read_text())
        for kernel in ("relu2", "odd_outputs")
    }


@pytest.fixture(scope="session")
def adversarial_report(adversarial_reports) -> dict:
    return adversarial_reports["relu2"]


@pytest.fixture(scope="session")
def timed_pair(tmp_path_factory) -> Path:
    """The baseline and `fast` (a copy of it) on one small shape, one trial, timed briefly: built
    once; a test that builds it again works on `copy_project(timed_pair, ...)`."""
    root = tmp_path_factory.mktemp("timed_pair")
    shutil.copy(FIXTURES / "adversarial/good.py", root / "fast.py")
    relu2_project(
        root, ["fast"], "[[8, 16]]", defaults="trials = 1", timing="warmup_ms = 5\nbudget_ms = 60\nrounds = 3"
    )
    # a 10 ms budget in 2 rounds once read the copy's calls at half the baseline's (5.8 against 11.4 µs) and the
    # calls-alone check then failed the honest copy: the scenarios here need a conclusive timing to start from
    assert build_json(root)["failed"] == []
    return root


@pytest.fixture(scope="session")
def twin_build(tmp_path_factory) -> Path:
    """The baseline and `twin` (the same code) on one shape, built once with -j 2 (the twin's
    timing takes the baseline's worker from the baseline's own job): read it, or build it again
    on `copy_project(twin_build, ...)`."""
    root = tmp_path_factory.mktemp("twin")
    shutil.copy(FIXTURES / "adversarial" / "good.py", root / "twin.py")
    relu2_report(root, ["twin"], shapes="[[33, 65]]")
    return root


@pytest.fixture
def short_tmp():
    """A private temporary folder of a short path, for a test's own TMPDIR: the Unix sockets made
    under it (multiprocessing's forkserver makes one) must fit in 107 bytes, which a tmp_path in an
    xdist worker's folder can leave too little of."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="magpie-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def copy_project(built: Path, to: Path) -> Path:
    """A copy of a built project (a cache restored elsewhere: nothing in it is stale)."""
    shutil.copytree(built, to, symlinks=True)
    return to


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """magpie.serving.tiny_model built once, offline, with a Hugging Face cache of its own: read
    it in place, or copy it where a project must hold it (a project reads only files inside it)."""
    from magpie.serving.tiny_model import build

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
        return build(tmp_path_factory.mktemp("tiny") / "model")


def editable_venv(prefix: Path) -> Path:
    """A virtual environment at `prefix` (seeing this machine's packages) with this checkout installed
    editable, offline, as a user's `pip install -e .` would: the tests of what the README says a venv runs."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(prefix)], check=True)
    pip = [str(prefix / "bin" / "pip"), "install", "-q", "--no-index", "--no-build-isolation", "--no-deps"]
    install = subprocess.run([*pip, "-e", str(REPO)], capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr  # needs hatchling, editables (dev extra)
    return prefix
