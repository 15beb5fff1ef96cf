"""Code under test is an adversary: from inside its worker it tries to rewrite stored
verdicts, plant modules magpie imports, change the spec that judges it, leave processes
behind, stop or read other processes, fill shared memory and reach the network. Each attempt
must fail, the wrong candidate must be judged wrong, and nothing of it may survive the build."""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, build_json, magpie_in_process, relu2_project, relu2_report

from magpie import sandbox
from magpie.paths import cache_root
from magpie.sandbox import pids

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this host")

ATTACKER = '''
import glob, json, os, signal, socket, subprocess, sys, time

import torch

TOKEN = "{token}"
ROOT = "{root}"
SECRET = "{secret}"
CACHES = "{caches}"


def attempt(name, action):
    try:
        action()
        print("SUCCEEDED", name, flush=True)
    except Exception as err:
        print("failed", name, type(err).__name__, err, flush=True)


def rewrite_results():
    found = glob.glob(ROOT + "/workspaces/store/*/*/result.json")
    for path in found:
        with open(path, "w") as out:
            json.dump({{"correctness_state": "SUCCESS", "PWNED": TOKEN}}, out)
    if not found:
        raise FileNotFoundError("no stored result readable")


def plant_package():
    os.makedirs(ROOT + "/magpie", exist_ok=True)
    with open(ROOT + "/magpie/__init__.py", "w") as out:
        out.write("PWNED = True\\n")


def append_reference():
    with open(ROOT + "/spec.py", "a") as out:
        out.write("\\ndef reference(x):\\n    return x * 0\\n")


def fill_shared_memory():
    with open("/dev/shm/magpie-attack-" + TOKEN, "wb") as out:
        out.write(b"x" * (1 << 20))


def spoil_shared_memory():
    """A file in the host's /dev/shm (another program's segment, an evaluator's reference counts)."""
    with open("/dev/shm/magpie-victim-" + TOKEN, "r+b") as victim:
        victim.write(b"spoilt")


def leave_system_v_memory():
    """Made in the sandbox's own IPC namespace, it goes with it; in the host's it would outlive
    the build, and other candidates could find it by its key."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(int(TOKEN[:7], 16), 1 << 20, 0o1000 | 0o600) < 0:  # IPC_CREAT
        raise PermissionError(os.strerror(ctypes.get_errno()))


def read_a_home_secret():
    """A key in the home folder of whoever runs magpie: printed, the report would show it."""
    print("secret:", open(SECRET).read(), flush=True)


def read_password_hashes():
    if not open("/etc/shadow").read():
        raise PermissionError("/etc/shadow shows empty")


def poison_compiler_caches():
    """What magpie compiled for every Triton worker (its driver utilities), another
    implementation's cache, the report's compiled templates: each next worker, or the
    report job, would load what this one left."""
    for folder in (CACHES + "/triton-driver/" + TOKEN, CACHES + "/compiled/other-" + TOKEN,
                   CACHES + "/templates/" + TOKEN):
        os.makedirs(folder)
        with open(folder + "/cuda_utils.so", "wb") as out:
            out.write(b"x")


def write_temporary_folder():
    with open("/tmp/magpie-attack-" + TOKEN, "w") as out:
        out.write("x")


def leave_processes():
    subprocess.Popen(["sleep", "300", TOKEN], start_new_session=True)
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            os.execvp("sleep", ["sleep", "301", TOKEN])
        os._exit(0)


def stop_everyone():
    os.kill(-1, signal.SIGSTOP)  # every process this one may signal, but itself


def see_other_processes():
    """The test runner (pytest) and the build are outside: they must not be visible."""
    outside = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            line = open(f"/proc/{{pid}}/cmdline").read()
        except OSError:
            continue
        if "pytest" in line or "magpie build" in line or " build --json" in line:
            outside.append(pid)
    if not outside:
        raise PermissionError("none of the build's processes is visible")
    print("visible:", outside[:5], flush=True)


def read_parent_memory():
    with open(f"/proc/{{os.getppid() or 1}}/mem", "rb") as mem:
        mem.read(1)
    ppid = os.getppid()
    if ppid == 0:
        raise PermissionError("no parent visible")


def connect_out():
    socket.create_connection(("127.0.0.1", 9), timeout=1)


def talk_to_a_daemon():
    """A listening Unix socket in the project, as a daemon's (Docker's: a container with the
    host's files in it) would be anywhere readable."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(ROOT + "/daemon.sock")


def reach_the_host_by_another_family():
    """A netlink socket is on every Linux; where the machine is a VM, vsock reaches its host
    from any network namespace."""
    families = [socket.AF_NETLINK] + ([socket.AF_VSOCK] if hasattr(socket, "AF_VSOCK") else [])
    for family in families:
        socket.socket(family, socket.SOCK_DGRAM if family == socket.AF_NETLINK else socket.SOCK_STREAM).close()


def see_the_daemons_sockets():
    if not os.listdir("/run"):
        raise FileNotFoundError("/run is empty")


def ptrace_the_evaluator():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, 1, 0, 0) != 0:  # PTRACE_ATTACH to this namespace's init
        raise PermissionError(os.strerror(ctypes.get_errno()))


for name in ["rewrite_results", "plant_package", "append_reference", "fill_shared_memory", "spoil_shared_memory",
             "leave_system_v_memory",
             "poison_compiler_caches", "write_temporary_folder", "leave_processes", "see_other_processes",
             "read_parent_memory", "connect_out",
             "talk_to_a_daemon", "reach_the_host_by_another_family", "see_the_daemons_sockets", "read_a_home_secret",
             "read_password_hashes", "ptrace_the_evaluator", "stop_everyone"]:
    attempt(name, globals()[name])


def kernel(x):
    return torch.zeros_like(x)  # wrong everywhere
'''


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacked")
    token = uuid.uuid4().hex
    secret = Path.home() / f".magpie-test-secret-{token}"
    (root / "attacker.py").write_text(ATTACKER.format(token=token, root=root, secret=secret, caches=cache_root()))
    relu2_project(root, ["attacker"], shapes="[[33, 65]]", defaults="timeout_s = 60")
    spec_before = (root / "spec.py").read_text()
    secret.write_text(f"key-{token}")
    victim = shared_memory_victim(token)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
            daemon.bind(str(root / "daemon.sock"))
            daemon.listen()
            result = build_json(root, "-j", "1")
    finally:
        secret.unlink()
        spoilt = victim is not None and victim.read_bytes() != b"theirs"
        if victim is not None:
            victim.unlink()
    assert not spoilt
    return root, token, result, spec_before


def shared_memory_victim(token: str) -> Path | None:
    """A file in the host's /dev/shm for `spoil_shared_memory` to try; None where there is none."""
    if not os.path.isdir(sandbox.SHARED_MEMORY):
        return None
    victim = Path(sandbox.SHARED_MEMORY) / f"magpie-victim-{token}"
    victim.write_bytes(b"theirs")
    return victim


def attempts(root) -> dict[str, str]:
    logs = list((root / "workspaces/store").glob("*/*/worker-attacker.log"))
    lines = [line for log in logs for line in log.read_text().splitlines()]
    return {line.split()[1]: line for line in lines if line.split()[:1] in (["SUCCEEDED"], ["failed"])}


def test_the_wrong_candidate_is_judged_wrong_and_the_build_goes_on(attacked):
    root, _, result, _ = attacked
    assert result["failed"] == []
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    row = next(r for r in report["results"] if r["implementation"] == "attacker")
    assert row["correctness_state"] == "FAILED" and "allclose" in row["verdict"]


@pytest.mark.parametrize(
    "attack",
    [
        "rewrite_results",
        "plant_package",
        "append_reference",
        "fill_shared_memory",
        "spoil_shared_memory",
        "poison_compiler_caches",
        "write_temporary_folder",
        "see_other_processes",
        "read_parent_memory",
        "connect_out",
        "talk_to_a_daemon",
        "reach_the_host_by_another_family",
        "read_a_home_secret",
        "read_password_hashes",
        "ptrace_the_evaluator",
    ]
    + (["see_the_daemons_sockets"] if os.listdir("/run") else []),
)
def test_each_attack_fails_inside_the_sandbox(attacked, attack):
    root, _, _, _ = attacked
    tried = attempts(root)
    assert attack in tried, sorted(tried)
    assert tried[attack].startswith("failed"), tried[attack]


def test_nothing_it_touched_changed(attacked):
    root, token, _, spec_before = attacked
    assert not (root / "magpie").exists()
    assert (root / "spec.py").read_text() == spec_before
    for path in (root / "workspaces/store").glob("*/*/result.json"):
        assert token not in path.read_text(), path
    assert not os.path.exists(f"/dev/shm/magpie-attack-{token}")
    assert not os.path.exists(f"/tmp/magpie-attack-{token}")
    assert not (cache_root() / "triton-driver" / token).exists()
    assert not (cache_root() / "templates" / token).exists()
    assert not system_v_segment_left(token)


def system_v_segment_left(token: str) -> bool:
    """Whether the segment `leave_system_v_memory` made is in the host's IPC namespace."""
    with open("/proc/sysvipc/shm") as segments:  # key, in decimal, is the first column
        return str(int(token[:7], 16)) in [line.split()[0] for line in segments.readlines()[1:]]


def survivors(token: str) -> list[str]:
    """Processes whose command line names the token, once the build's parked processes, which
    end when they read the end of their command pipes, have had a moment to."""
    deadline = time.monotonic() + 5
    while True:
        found = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_no_process_it_started_outlives_the_build(attacked):
    _, token, _, _ = attacked
    assert survivors(token) == []


def test_reports_record_the_isolation_in_force(attacked):
    root, _, _, _ = attacked
    results = [json.loads(p.read_text()) for p in (root / "workspaces/store").glob("*/*/result.json")]
    judged = [r for r in results if r.get("task", "").startswith("correctness:")]
    assert judged and all("landlock" in r["isolation"] and "PID" in r["isolation"] for r in judged)


def test_the_sandbox_runs_a_command_as_the_first_process_of_its_namespace(tmp_path):
    policy = sandbox.Policy(write=[str(tmp_path)])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            "sh",
            "-c",
            "echo $$; touch ok; touch /tmp/escaped-$$ || echo denied",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[0] == "2" and lines[-1] == "denied"  # the namespace's init is 1
    assert (tmp_path / "ok").exists()


def test_a_folder_made_again_outside_is_no_longer_hidden_from_a_sandbox_started_before(tmp_path):
    """A kept-warm worker may serve a later build only while its sandbox still hides that
    build's store: removing a covered folder outside takes the cover with it, and the folder
    made again in its place would be in sight (`namespaces.still_hidden`, checked on adoption)."""
    from magpie.linux.namespaces import still_hidden

    store, scratch = tmp_path / "store", tmp_path / "scratch"
    store.mkdir()
    scratch.mkdir()
    (store / "secret").write_text("input secret")
    policy = sandbox.Policy(write=[str(scratch)], read=[str(tmp_path)], hide=[str(store)])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            "sh",
            "-c",
            f"ls {store}; echo ready; sleep 60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"  # nothing listed: the store is covered
        assert still_hidden(proc.pid, [str(store), str(tmp_path / "absent")])
        shutil.rmtree(store)
        store.mkdir()
        (store / "secret").write_text("the next build's secret")
        assert not still_hidden(proc.pid, [str(store)])
    finally:
        proc.kill()
        proc.wait()


def test_a_signal_the_code_sends_itself_ends_it_with_that_signal(tmp_path):
    """The code does not run as PID 1 (which ignores signals it sends itself): abort() is SIGABRT."""
    policy = sandbox.Policy(write=[str(tmp_path)])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            sys.executable,
            "-c",
            "import os; os.abort()",
        ],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -6


SEGMENT_WIPER = '''
import ctypes

import torch

import magpie.harness.exchange as exchange

_cuda = ctypes.CDLL("libcuda.so.1")
_loads_shared = exchange.loads_shared


def _wipe(value):
    """Zero the whole allocation CUDA IPC mapped for a lent tensor, not just the tensor."""
    if torch.is_tensor(value) and value.is_cuda:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if _cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(value.data_ptr())) == 0:
            torch.cuda.synchronize()
            _cuda.cuMemsetD8_v2(base, ctypes.c_ubyte(0), size)
            torch.cuda.synchronize()
            print("wiped", size.value, "bytes", flush=True)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _wipe(item)
    elif isinstance(value, dict):
        for item in value.values():
            _wipe(item)


def _loads(payload):
    value = _loads_shared(payload)
    _wipe(value)
    return value


exchange.loads_shared = _loads


def kernel(x):
    return torch.zeros_like(x)  # wrong, unless the references were wiped too
'''


@pytest.mark.gpu
def test_attacks_fail_on_the_gpu_too(tmp_path):
    """The same attacks from a GPU worker, plus one of its own: memory lent through CUDA IPC
    is a whole allocator segment, and wiping it must reach nothing but the worker's own copies."""
    token = uuid.uuid4().hex
    secret = Path.home() / f".magpie-test-secret-{token}"
    (tmp_path / "attacker.py").write_text(
        ATTACKER.format(token=token, root=tmp_path, secret=secret, caches=cache_root())
    )
    secret.write_text(f"key-{token}")
    (tmp_path / "wiper.py").write_text(SEGMENT_WIPER)
    relu2_project(
        tmp_path, ["attacker", "wiper"], shapes="[[33, 65], [256, 1024]]", defaults="timeout_s = 120", device="cuda"
    )
    victim = shared_memory_victim(token)
    try:
        assert build_json(tmp_path, "-j", "2")["failed"] == []
    finally:
        secret.unlink()
        spoilt = victim.read_bytes() != b"theirs"
        victim.unlink()
    assert not spoilt  # out of its view: its /dev/shm is its own
    report = json.loads((tmp_path / "workspaces/reports/relu2/compare_report.json").read_text())
    rows = {r["implementation"]: r for r in report["results"]}
    assert rows["good"]["correctness_state"] == "SUCCESS"
    assert rows["attacker"]["correctness_state"] == "FAILED" and "allclose" in rows["attacker"]["verdict"]
    # what the wiper zeroed was its own copy of the inputs (the judge's originals and references live
    # elsewhere): it changed its inputs and its zeros match no reference
    assert rows["wiper"]["correctness_state"] == "FAILED", rows["wiper"]
    wiped = "".join(p.read_text() for p in (tmp_path / "workspaces/store").glob("*/*/worker-wiper.log"))
    assert "wiped" in wiped  # the attack ran
    tried = attempts(tmp_path)
    # a GPU sandbox writes its own /dev/shm (counted with its scratch folder), never the host's
    succeeded = {
        name: line
        for name, line in tried.items()
        if not line.startswith("failed")
        and name not in ("stop_everyone", "leave_processes", "leave_system_v_memory", "fill_shared_memory")
    }
    assert tried and succeeded == {}, succeeded
    assert not system_v_segment_left(token)  # made in the sandbox's own IPC namespace, gone with it
    assert survivors(token) == []
    assert not os.path.exists(f"/dev/shm/magpie-attack-{token}")
    assert not (cache_root() / "triton-driver" / token).exists()
    assert not (cache_root() / "templates" / token).exists()


OTHER_GPU = """
import torch

try:
    torch.ones(1, device="cuda:1").sum().item()
    print("other GPU used", flush=True)
except Exception as err:
    print("other GPU refused:", type(err).__name__, flush=True)
print("GPUs counted:", torch.cuda.device_count(), flush=True)


def kernel(x):
    return torch.relu(x) * 2
"""


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_worker_opens_only_the_gpu_it_is_timed_on(tmp_path, device):
    """On a host of several GPUs, every GPU's node open let a worker split a batch's work over
    two and read twice as fast; now only the node of the evaluator's GPU is (its minor number
    from the driver, by the GPU's UUID), and the worker is judged on that one, which it sees as
    its device 0 (what is lent to it mapped there) when the project names another."""
    if len(sandbox.nvidia_gpu_nodes()) < 2:
        pytest.skip("one GPU on this host")
    (tmp_path / "splitter.py").write_text(OTHER_GPU)
    relu2_project(tmp_path, ["splitter"], shapes="[[256, 1024]]", defaults="timeout_s = 120", device=device)
    assert build_json(tmp_path, "-j", "1")["failed"] == []
    rows = {
        r["implementation"]: r
        for r in json.loads((tmp_path / "workspaces/reports/relu2/compare_report.json").read_text())["results"]
    }
    assert rows["splitter"]["correctness_state"] == "SUCCESS" and rows["good"]["correctness_state"] == "SUCCESS", rows
    assert rows["splitter"]["performance_state"] == "SUCCESS", rows["splitter"]  # timed on the lent region
    log = "".join(p.read_text() for p in (tmp_path / "workspaces/store").glob("*/*/worker-splitter.log"))
    assert "other GPU refused" in log and "other GPU used" not in log and "GPUs counted: 1" in log, log
    stored = [json.loads(p.read_text()) for p in (tmp_path / "workspaces/store").glob("*/*/result.json")]
    judged = [r for r in stored if r.get("task", "").startswith("correctness:")]
    assert judged and all(r["isolation"].count("/dev/nvidia") == 1 for r in judged), [r["isolation"] for r in judged]


def test_commands_of_rules_and_testcases_write_only_their_own_folders(command_project):
    """A candidate's compile command and a command testcase run in the sandbox too: the
    testcase may write its TMPDIR, not the project it reads."""
    manifest = command_project / "magpie.toml"
    text = manifest.read_text().replace(
        'source = "k1/a.py"\n',
        'source = "k1/a.py"\ntype = "cuda"\ncompile_command = "touch $TMPDIR/ok && touch planted_by_compile"\n',
        1,
    )
    text = text.replace(
        "command = \"python -c 'import sys; sys.exit(0)'\"",
        'command = "touch $TMPDIR/fine && touch planted_by_testcase"',
        1,
    )
    manifest.write_text(text)
    magpie_in_process("build", cwd=command_project, check=0)  # what the sandbox holds is the workers'
    assert not (command_project / "planted_by_compile").exists()
    assert not (command_project / "planted_by_testcase").exists()
    results = [json.loads(p.read_text()) for p in (command_project / "workspaces/store").glob("*/*/result.json")]
    by_task = {r["task"]: r for r in results}
    assert by_task["compile:k1/a"]["compiling_state"] == "FAILED"
    assert by_task["correctness:k1/base"]["correctness_state"] == "FAILED"
    assert "landlock" in by_task["correctness:k1/base"]["isolation"]


def test_a_host_without_a_sandbox_is_refused_unless_the_code_is_trusted(command_project, tmp_path_factory):
    """Inside magpie's own sandbox no namespace can be made (seccomp): the build there is a host
    that allows no sandbox. It refuses in one line, and runs with --trust-code."""
    temporary = tmp_path_factory.mktemp("tmp")
    # a /dev/shm of its own: the build inside keeps its scratch there, out of other builds' way
    # magpie's dependencies where this host keeps them (on the H200, a PYTHONPATH under /tmp,
    # which a sandbox covers)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)]
    policy = sandbox.Policy(
        write=[str(command_project), str(temporary), "/dev/shm"], read=paths, hide=["/dev/shm"], network=True
    )
    outer = [
        sys.executable,
        "-m",
        "magpie.sandbox",
        json.dumps(policy.to_json()),
        "--",
        sys.executable,
        "-m",
        "magpie",
        "build",
        "--json",
    ]
    # the store's signing key where the build inside may write it
    env = {**os.environ, "TMPDIR": str(temporary), "XDG_CONFIG_HOME": str(temporary / "config")}
    refused = subprocess.run(outer, cwd=command_project, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("magpie: cannot sandbox code under test here: namespaces:")
    assert "--trust-code" in refused.stderr and "Traceback" not in refused.stderr
    assert not (command_project / "workspaces/reports").exists()
    trusted = subprocess.run(
        outer + ["--trust-code"], cwd=command_project, capture_output=True, text=True, timeout=300, env=env
    )
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["failed"] == []
    results = [json.loads(p.read_text()) for p in (command_project / "workspaces/store").glob("*/*/result.json")]
    assert {r["isolation"] for r in results if r["task"].startswith("correctness:")} == {sandbox.describe(None)}


SNOOP = """
import os
import shutil

import torch

print("environment", sorted(k for k in os.environ if "SECRET" in k), flush=True)
print("store", sorted(os.listdir("workspaces")) if os.path.isdir("workspaces") else "absent", flush=True)


def kernel(x):
    return torch.relu(x) * 2.0
"""


def test_inputs_come_from_a_secret_that_code_under_test_cannot_read(tmp_path):
    """Each build mixes a secret of its own into every input seed (so seeds re-derived from
    magpie.toml predict nothing); the secret is in no worker's environment, and the store that
    records it is hidden from workers."""
    (tmp_path / "snoop.py").write_text(SNOOP)
    relu2_project(tmp_path, ["snoop"], shapes="[[33, 65]]")
    seeds = []
    for _ in range(2):
        assert build_json(tmp_path)["failed"] == []
        folder = next(
            p.parent
            for p in (tmp_path / "workspaces/store").glob("*/*/result.json")
            if json.loads(p.read_text()).get("task") == "correctness:relu2/snoop"
        )
        correctness = json.loads((folder / "result.json").read_text())
        assert correctness["correctness_state"] == "SUCCESS" and len(correctness["input_secret"]) == 32
        seeds.append([c["seed"] for c in correctness["checks"]])
        log = (folder / "worker-snoop.log").read_text()  # the process that imported it
        assert "environment []" in log and "store []" in log, log
        magpie_in_process("clean", "--all", cwd=tmp_path, check=0)
    assert seeds[0] != seeds[1]


def test_each_build_of_one_process_draws_a_secret_of_its_own(tmp_path, monkeypatch):
    """A process that builds again (a library caller, a server, this test run) draws a new secret
    each time: the one a build made is not left in the environment for the next to inherit."""
    from magpie.cli import main
    from magpie.environment import INPUT_SECRET

    monkeypatch.delenv(INPUT_SECRET, raising=False)
    (tmp_path / "twin.py").write_text((FIXTURES / "adversarial" / "good.py").read_text())
    relu2_project(tmp_path, ["twin"], shapes="[[33, 65]]")
    secrets = []
    for _ in range(2):
        assert main(["build", "-m", str(tmp_path / "magpie.toml"), "--plain"]) == 0
        assert INPUT_SECRET not in os.environ
        secrets += [
            json.loads(p.read_text())["input_secret"]
            for p in (tmp_path / "workspaces/store").glob("*/*/result.json")
            if json.loads(p.read_text()).get("task") == "correctness:relu2/twin"
        ]
        assert main(["clean", "-m", str(tmp_path / "magpie.toml"), "--all"]) == 0
    assert len(secrets) == 2 and secrets[0] != secrets[1]


def _world_readable(path) -> bool:
    from pathlib import Path

    return all(p.stat().st_mode & 0o005 == 0o005 for p in [Path(path), *Path(path).parents])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
@pytest.mark.parametrize("shared_memory", [None, "tmpfs", "lent"])
def test_the_sandbox_works_for_an_unprivileged_user(shared_memory):
    """As nobody (no capability, no mapping but its own): the same namespaces and rules; on a
    GPU its own /dev/shm, an empty tmpfs or a worker's folder, mounts there too."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__)))
    # the sandbox needs only the standard library: the system's interpreter will do
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.path.exists(p) and _world_readable(p)), None)
    if not _world_readable(repo) or python is None:
        pytest.skip("magpie or an interpreter is not readable by another user here")
    if shared_memory and not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    scratch = tempfile.mkdtemp()  # pytest's own folders are root's alone
    lent = tempfile.mkdtemp(prefix="magpie-test-lent-", dir=sandbox.SHARED_MEMORY) if shared_memory == "lent" else None
    for folder in filter(None, (scratch, lent)):
        os.chown(folder, 65534, 65534)
    policy = sandbox.Policy(write=[str(scratch)], gpu=shared_memory is not None, shared_memory=lent)
    script = f"id -u; echo $$; touch {scratch}/ok && echo wrote; touch /tmp/unprivileged-$$ || echo denied"
    if shared_memory:
        script += "; touch /dev/shm/own && echo shm"
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": repo},
    )
    shutil.rmtree(scratch)
    in_lent = lent is not None and os.path.exists(os.path.join(lent, "own"))
    if lent:
        shutil.rmtree(lent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["65534", "2", "wrote", "denied", *(["shm"] if shared_memory else [])], proc.stdout
    assert in_lent == (shared_memory == "lent")
    assert not os.path.exists("/dev/shm/own")


def test_a_build_in_another_pid_namespace_leaves_this_ones_scratch_alone():
    """A folder's owner is a pid of the namespace that made it: a sweep in another namespace
    (a build inside a sandbox or a container sharing /dev/shm) cannot see it and keeps away."""
    from magpie.supervision import scratch

    folder = scratch.make("owned-")
    try:
        policy = sandbox.Policy(write=[str(scratch.root())])
        code = "import magpie.supervision.scratch as s; print(s.sweep())"
        proc = subprocess.run(
            sandbox.command([sys.executable, "-c", code], policy), capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert folder.is_dir()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_what_code_under_test_leaves_at_its_folders_owner_file_neither_redirects_nor_stalls_magpie(tmp_path):
    """The owner file lies in the folder the worker writes: taken over, a link there made
    magpie write the owner through it, and a fifo there would stall the next build's sweep."""
    from magpie.supervision import scratch

    victim = tmp_path / "victim.txt"
    victim.write_text("victim")
    folder = scratch.make("owned-")
    try:
        owner = folder / scratch.OWNER
        owner.unlink()
        owner.symlink_to(victim)
        scratch.own(folder, os.getpid())
        assert victim.read_text() == "victim" and not owner.is_symlink()
        owner.unlink()
        os.mkfifo(owner)
        os.utime(folder, (0, 0))
        code = "import magpie.supervision.scratch as s; print(s.sweep())"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert not folder.exists()  # no owner to read: removed, as an abandoned folder is
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PING = """
import json, os, socket, sys
path = sys.argv[1]
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
    conn.settimeout(10)
    conn.connect(path)
    try:  # the zygote may close the connection before the request is even sent
        conn.sendall(json.dumps({"op": "ping"}).encode() + b"\\n")
        print("answer", conn.recv(64))
    except (BrokenPipeError, ConnectionResetError):
        print("answer b''")
"""


def test_code_under_test_that_finds_the_zygotes_socket_is_not_answered(tmp_path):
    """Landlock does not guard connecting to a Unix socket by its path; a fork asked of the
    zygote would run outside the sandbox. The zygote answers only its own PID namespace (where
    sockets are allowed, as a profiler's sandbox allows them; elsewhere no Unix socket can be
    made at all)."""
    from magpie import environment
    from magpie.supervision import zygote

    with zygote.session(prestart=True):
        folder = Path(os.environ[environment.ZYGOTE_DIR])
        deadline = time.monotonic() + 120
        while not list(folder.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        sock = str(next(folder.glob("*.sock")))
        (tmp_path / "ping.py").write_text(PING)
        outside = subprocess.run(
            [sys.executable, str(tmp_path / "ping.py"), sock], capture_output=True, text=True, timeout=60
        )
        # the temporary folder left visible (sandboxes hide it too): the zygote's own check is tested
        policy = sandbox.Policy(write=[str(tmp_path)], read=[str(tmp_path), str(folder)], temporary=[], network=True)
        inside = subprocess.run(
            sandbox.command([sys.executable, str(tmp_path / "ping.py"), sock], policy),
            capture_output=True,
            text=True,
            timeout=60,
        )
        policy.network = False
        no_socket = subprocess.run(
            sandbox.command([sys.executable, str(tmp_path / "ping.py"), sock], policy),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert "pong" in outside.stdout, outside.stderr  # the test reaches the zygote as magpie does
    assert "pong" not in inside.stdout and "answer b''" in inside.stdout, (inside.stdout, inside.stderr)
    assert "PermissionError" in no_socket.stderr and "answer" not in no_socket.stdout


def test_a_sandbox_with_sockets_finds_none_in_the_scratch_root(tmp_path):
    """The scratch root (in /dev/shm where it has room) holds every build's zygote folder, its
    socket among them: a sandbox that may make sockets (a profiler's, network allowed) finds
    the root covered but for its own folders, and connects to nothing there."""
    from magpie.supervision import scratch as scratch_folders

    folder = scratch_folders.make("zygote-")
    own = scratch_folders.make("w-")
    listener = folder / "test.sock"
    probe = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('connected')"
    policy = sandbox.Policy(write=[str(tmp_path), str(own)], read=[str(tmp_path)], network=True)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
            daemon.bind(str(listener))
            daemon.listen()
            reached = subprocess.run(
                [sys.executable, "-c", probe, str(listener)], capture_output=True, text=True, timeout=60
            )
            inside = subprocess.run(
                sandbox.command([sys.executable, "-c", probe, str(listener)], policy),
                capture_output=True,
                text=True,
                timeout=60,
            )
            exists = "import os, sys; print(*map(os.path.exists, sys.argv[1:]))"
            seen = subprocess.run(
                sandbox.command([sys.executable, "-c", exists, str(folder), str(own)], policy),
                capture_output=True,
                text=True,
                timeout=60,
            )
    finally:
        scratch_folders.remove(folder)
        scratch_folders.remove(own)
    assert "connected" in reached.stdout, reached.stderr
    assert "connected" not in inside.stdout and "FileNotFoundError" in inside.stderr, (inside.stdout, inside.stderr)
    assert seen.stdout.split() == ["False", "True"], (seen.stdout, seen.stderr)  # its own folder bound back alone


def test_code_under_test_opens_only_byte_devices_and_on_a_gpu_the_gpus_nodes(monkeypatch):
    """As root, sandboxed code could open /dev/loop0, /dev/kvm and /dev/btrfs-control for
    writing. Now only /dev/null and friends; a GPU project's code also the GPU's nodes, a CPU
    project's none of them (work sent to a GPU would escape the CPU time that times it)."""
    listing = [
        "null",
        "urandom",
        "loop0",
        "kvm",
        "tty",
        "pts",
        "nvidia0",
        "nvidiactl",
        "nvidia-uvm",
        "kfd",
        "dri",
        "shm",
    ]
    from magpie.sandbox import devices

    monkeypatch.setattr(devices.os, "listdir", lambda path: listing)
    monkeypatch.setattr(devices, "_is_device", lambda path: True)
    assert sandbox.device_files(sandbox.Policy(write=[])) == ["/dev/null", "/dev/urandom"]
    assert sandbox.device_files(sandbox.Policy(write=[], gpu=True)) == [
        "/dev/null",
        "/dev/urandom",
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/kfd",
        "/dev/dri",
    ]
    # a policy that names its GPU: that GPU's own node, not another's; the shared ones stay
    listing.append("nvidia1")
    assert sandbox.device_files(sandbox.Policy(write=[], gpu=True, gpu_minors=[1])) == [
        "/dev/null",
        "/dev/urandom",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/kfd",
        "/dev/dri",
        "/dev/nvidia1",
    ]


def test_sandboxed_code_cannot_open_a_block_device_or_kvm(tmp_path):
    """The same, end to end, where this host has the nodes (as root the owner's permissions
    would let it open them)."""
    targets = [p for p in ("/dev/loop0", "/dev/kvm", "/dev/btrfs-control", "/dev/tty") if os.path.exists(p)]
    if not targets:
        pytest.skip("no such device node on this host")
    opener = "; ".join(
        f"python3 -c \"import os; os.open('{p}', os.O_RDWR)\" 2>/dev/null && echo '{p} opened'" for p in targets
    )
    policy = sandbox.Policy(write=[str(tmp_path)])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            "sh",
            "-c",
            f"{opener}; python3 -c \"open('/dev/null', 'w').write('x')\" && echo null",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.split() == ["null"], proc.stdout


def test_a_gpus_node_is_found_by_its_uuid_in_the_drivers_own_description(monkeypatch):
    """The minor number of a GPU's node (/dev/nvidiaN) is what the NVIDIA driver says of the GPU
    with that UUID (the H200 pair's own /proc/driver/nvidia/gpus); where it says nothing, None:
    every GPU's node stays open rather than none."""
    from magpie.linux import procfs

    monkeypatch.setattr(procfs, "NVIDIA_GPUS", str(REPO / "tests/fixtures/h200x2/nvidia_gpus"))
    assert sandbox.nvidia_minor("GPU-cfa66104-84c5-f90a-3572-cbf3e0211204") == 1
    assert sandbox.nvidia_minor("1a0aae44-7367-99fe-b5ae-6c22e7a62b29") == 0  # as torch gives it, no prefix
    assert sandbox.nvidia_minor("00000000-0000-0000-0000-000000000000") is None
    monkeypatch.setattr(procfs, "NVIDIA_GPUS", "/nonexistent")
    assert sandbox.nvidia_minor("1a0aae44-7367-99fe-b5ae-6c22e7a62b29") is None
    policy = sandbox.Policy(write=[], gpu=True, gpu_minors=[1])
    assert "GPU /dev/nvidia1 only" in sandbox.describe(policy)
    assert "every GPU of the host" in sandbox.describe(sandbox.Policy(write=[], gpu=True))


def test_what_is_lent_to_a_worker_that_sees_one_gpu_is_rebuilt_on_it(monkeypatch):
    """A worker whose sandbox opens one GPU's node sees it as device 0, where the evaluator may
    know it as device 1: the tensors and events lent to it are rebuilt on device 0."""
    import pickle

    import torch.multiprocessing.reductions as reductions

    from magpie.harness.exchange import _OnTheOneGpu

    class Lent:
        def __init__(self, rebuild, args):
            self.rebuild, self.args = rebuild, args

        def __reduce__(self):
            return self.rebuild, self.args

    tensor_args = ("cls", (4,), (1,), 0, "storage", "float32", 1, b"handle", 16, 0, False, b"ref", 0, b"event", True)
    payload = pickle.dumps(
        [Lent(reductions.rebuild_cuda_tensor, tensor_args), Lent(reductions.rebuild_event, (1, b"h"))]
    )
    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", lambda *args: ("tensor", args))
    monkeypatch.setattr(reductions, "rebuild_event", lambda *args: ("event", args))
    tensor, event = _OnTheOneGpu(io.BytesIO(payload)).load()
    assert tensor == ("tensor", (*tensor_args[:6], 0, *tensor_args[7:]))
    assert event == ("event", (0, b"h"))


FORKS = """
import os, sys, time
made = 0
for _ in range(int(sys.argv[1])):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
    except OSError:
        break
    made += 1
time.sleep(1)  # the processes made are all there a while: a watch that counts them sees them
print("made", made, flush=True)
"""


def sandbox_cgroups() -> set[str]:
    return {
        os.path.join(parent, name)
        for parent in pids.parents()
        if os.path.isdir(parent)
        for name in os.listdir(parent)
        if name.startswith(pids.PREFIX)
    }


def test_code_under_test_starts_no_more_processes_than_its_limit_even_as_root(tmp_path):
    """RLIMIT_NPROC does not bind the host's root, whatever user namespace it is in: as root a
    sandbox held 700 processes under a limit of 512, and a fork bomb would have taken every
    process ID of the host until its timeout. As root each sandbox is now a pids cgroup of its
    own, gone when the sandbox ends; the isolation line says which holds."""
    (tmp_path / "forks.py").write_text(FORKS)
    before = sandbox_cgroups()
    policy = sandbox.Policy(write=[str(tmp_path)], read=[str(tmp_path)], processes=40)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            sys.executable,
            str(tmp_path / "forks.py"),
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "40 processes" in sandbox.describe(policy)
    if os.geteuid() == 0 and not pids.available():
        # no cgroup to be had (the H200 host's container delegates only memory): the sandbox's
        # init counts them and ends the sandbox once there are more
        assert proc.returncode == sandbox.SANDBOX_LIMIT, (proc.stdout, proc.stderr)
        assert "more than 40 processes and threads" in proc.stderr, proc.stderr
        assert "counted every" in sandbox.describe(policy)
        return
    made = int(proc.stdout.split()[-1])
    assert 0 < made < 40, (proc.stdout, proc.stderr)
    assert sandbox_cgroups() <= before  # its cgroup went with it


def test_a_pids_cgroup_is_made_only_where_its_controller_is_delegated(tmp_path, monkeypatch):
    """On the H200 host (cgroup v2, a container's cgroup with memory alone delegated) a child
    cgroup could be made, but with no pids.max: the limit went unwritten and the isolation line
    said "(pids cgroup)" while 100 processes ran under a limit of 40."""
    own = tmp_path / "process_api" / "48f8c162"
    own.mkdir(parents=True)
    monkeypatch.setattr(pids, "ROOT", str(tmp_path))
    monkeypatch.setattr(pids, "own_cgroup", lambda controller: "/process_api/48f8c162" if controller == "" else None)
    (own / "cgroup.controllers").write_text("memory\n")
    assert pids.parents() == [] and not pids.available()
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    assert pids.parents() == [str(own)]


FILLS = """
import sys, time
for i in range(8):
    with open(f"{sys.argv[1]}/fill{i}", "wb") as out:
        out.write(b"x" * (16 << 20))
    print("wrote", i + 1, flush=True)
    time.sleep(0.1)
time.sleep(30)  # the sandbox is to end it well before
"""


def test_code_under_test_that_fills_its_folders_is_ended_and_says_why(tmp_path):
    """A worker's scratch folder lies in /dev/shm, which is memory, and each file it writes
    is limited, not how many: code under test wrote 1.5 GiB there in files of 512 MiB. Now the
    sandbox's init looks at what its write trees hold every 0.1 s and ends the sandbox once
    they hold more than `written_mb`, with one line and an exit status of its own."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    (tmp_path / "fills.py").write_text(FILLS)
    policy = sandbox.Policy(write=[str(folder)], read=[str(tmp_path)], written_mb=64)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            sys.executable,
            str(tmp_path / "fills.py"),
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == sandbox.SANDBOX_LIMIT, (proc.returncode, proc.stderr)
    assert "its folders held more than 64 MiB" in proc.stderr
    assert int(proc.stdout.split()[-1]) < 8 and time.monotonic() - started < 20
    from magpie.harness.kinds import failure_kind

    assert failure_kind(f"exited with code {sandbox.SANDBOX_LIMIT}: sandbox: its folders held") == "sandbox_violation"


UNIX_PROBE = """
import socket, sys
for family in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_VSOCK"):
    try:
        socket.socket(getattr(socket, family), socket.SOCK_DGRAM if family == "AF_NETLINK" else socket.SOCK_STREAM)
        print(family, "made")
    except OSError as err:
        print(family, "refused", err.errno)
with socket.socket(socket.AF_UNIX) as client:
    try:
        client.connect(sys.argv[1])
        print("connected")
    except OSError as err:
        print("connect failed", err.errno)
"""


def test_a_gpu_sandbox_makes_only_unix_sockets_and_finds_no_socket_in_a_home(tmp_path):
    """CUDA's initialisation fails where socket(AF_UNIX) is refused (error 304 on the H200), so
    a GPU sandbox may make Unix sockets, and no other family. What it could connect them to is
    what the sandbox shows: a socket in a home folder (an agent's, a multiplexer's) is covered,
    as are /run's and /tmp's."""
    listener = Path.home() / f".magpie-test-{uuid.uuid4().hex[:12]}.sock"
    probe = tmp_path / "probe.py"
    probe.write_text(UNIX_PROBE)
    policy = sandbox.Policy(write=[str(tmp_path)], read=[str(tmp_path)], gpu=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
        daemon.bind(str(listener))
        daemon.listen()
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "magpie.sandbox",
                    json.dumps(policy.to_json()),
                    "--",
                    sys.executable,
                    str(probe),
                    str(listener),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            listener.unlink()
    lines = proc.stdout.splitlines()
    assert lines[0] == "AF_UNIX made", (proc.stdout, proc.stderr)
    assert all(line.endswith("refused 13") for line in lines[1:5]), lines
    assert lines[5] == "connect failed 2", lines  # no such file: the home folder shows empty


SHARED_MEMORY_PROBE = r"""
import os, sys
own, lent, *theirs = sys.argv[1:]
sys.stdin.readline()  # once the evaluator has lent what it lends
with open(os.path.join(own, "mine"), "wb") as f:
    f.write(b"mine")
with open("/dev/shm/made-inside", "wb") as f:
    f.write(b"inside")
print("seen:", sorted(n for n in os.listdir("/dev/shm") if n != "made-inside"))
print("scratch folders seen:", sorted(os.listdir(os.path.dirname(own))))
if lent:
    with open(os.path.join("/dev/shm", lent), "r+b") as f:
        print("lent reads", f.read().decode())
        f.seek(0)
        f.write(b"mapped")
for path in theirs:
    try:
        with open(path, "r+b") as f:
            f.write(b"mine")
        print("written", path)
    except OSError as err:
        print("refused", err.errno)
"""


@pytest.mark.parametrize("lent", [False, True], ids=["its own empty one", "a folder files are lent into"])
def test_a_gpu_sandbox_has_a_shared_memory_of_its_own(tmp_path, lent):
    """CUDA needs /dev/shm (the driver keeps the state of interprocess events in files there;
    torch the reference counts of lent memory), where other jobs' scratch folders, other
    programs' segments and the evaluators' own files lay within reach: a GPU sandbox read and
    wrote them, and what it wrote there was counted nowhere. Now it sees a /dev/shm of its own,
    its scratch folder bound back: an empty tmpfs, or for a worker a folder of its own, into
    which the evaluator links, after the sandbox began, the files of what it lends
    (`supervision.shared_memory`)."""
    from magpie.supervision import scratch as scratch_folders
    from magpie.supervision import shared_memory

    if not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    own, other = scratch_folders.make("own-"), scratch_folders.make("other-")
    token = uuid.uuid4().hex[:12]
    host_file = Path(sandbox.SHARED_MEMORY) / f"magpie-test-{token}"
    evaluators = Path(sandbox.SHARED_MEMORY) / f"torch_{os.getpid()}_{uuid.uuid4().int % 10**9}_0"
    folder = scratch_folders.lent_folder(own, make=True)
    try:
        (other / "outputs.pt").write_bytes(b"theirs")
        host_file.write_bytes(b"theirs")
        evaluators.write_bytes(b"counts")
        (own / "probe.py").write_text(SHARED_MEMORY_PROBE)
        policy = sandbox.Policy(write=[str(own)], read=[], gpu=True, shared_memory=str(folder) if lent else None)
        argv = [
            sys.executable,
            "-m",
            "magpie.sandbox",
            json.dumps(policy.to_json()),
            "--",
            sys.executable,
            str(own / "probe.py"),
            str(own),
            evaluators.name if lent else "",
            str(other / "outputs.pt"),
            str(host_file),
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
        if lent:  # made after the sandbox began, as an evaluator's are: linked in before its request goes
            shared_memory.made()
            shared_memory.Lending(folder).sync()
        out, err = proc.communicate("go\n", timeout=60)
        lines = out.splitlines()
        seen = [own.parent.name] + ([evaluators.name] if lent else [])
        assert lines[:2] == [f"seen: {sorted(seen)}", f"scratch folders seen: {[own.name]}"], (out, err)
        if lent:
            assert lines[2] == "lent reads counts"
            assert evaluators.read_bytes() == b"mapped"  # the evaluator's own file, not a copy
        assert lines[-2:] == ["refused 2", "refused 2"], lines  # no such file: out of its view
        assert (other / "outputs.pt").read_bytes() == host_file.read_bytes() == b"theirs"
        assert (own / "mine").read_bytes() == b"mine"
        assert not (Path(sandbox.SHARED_MEMORY) / "made-inside").exists()
        assert (folder / "made-inside").exists() == lent  # where it is counted with its scratch folder
    finally:
        for path in (host_file, evaluators):
            path.unlink(missing_ok=True)
        for path in (own, other):
            scratch_folders.remove(path)
    assert not folder.exists()


def test_only_the_files_of_what_this_process_lends_are_linked_into_a_workers_shared_memory(tmp_path):
    """The evaluator links its own CUDA IPC files (named by its pid, regular, its user's), not
    another process's; a file the worker planted under a name the evaluator's driver will use
    is replaced, and a link already in place is left as it is. Once a process has ended, the
    zygote that reaps it removes its files."""
    from magpie.supervision import shared_memory

    if not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    pid = os.getpid()
    shm = Path(sandbox.SHARED_MEMORY)
    own = [shm / f"torch_{pid}_{uuid.uuid4().int % 10**9}_0", shm / f"cuda.shm.0.{pid:x}.{uuid.uuid4().int % 1000}"]
    foreign = [shm / f"torch_{pid + 1}_{uuid.uuid4().int % 10**9}_0", shm / f"cuda.shm.0.{pid + 1:x}.7"]
    planted_link = shm / f"torch_{pid}_{uuid.uuid4().int % 10**9}_1"
    folder = shm / f"magpie-test-lent-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    try:
        for path in (*own, *foreign):
            path.write_bytes(path.name.encode())
        planted_link.symlink_to(own[0])
        (folder / own[1].name).write_bytes(b"planted")
        assert sorted(shared_memory.own_files()) >= sorted(p.name for p in own)
        assert not {p.name for p in (*foreign, planted_link)} & set(shared_memory.own_files())
        lending = shared_memory.Lending(folder)
        shared_memory.made()
        lending.sync()
        for path in own:
            assert (folder / path.name).stat().st_ino == path.stat().st_ino
        assert not any((folder / p.name).exists() for p in (*foreign, planted_link))
        assert sorted(os.listdir(folder)) == sorted(p.name for p in own)  # no staged name left
        (folder / own[0].name).unlink()
        lending.sync()  # nothing lent since: not looked at again
        assert not (folder / own[0].name).exists()
        # a process that has ended: what was made for it goes (the driver leaves its event pool)
        shared_memory.forget(pid + 1)
        assert not any(p.exists() for p in foreign) and all(p.exists() for p in own)
    finally:
        for path in (*own, *foreign, planted_link):
            path.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_lent_to_a_worker_whose_scratch_folder_is_gone_is_swept():
    """What a killed build leaves: its workers' scratch folders go with the next build's sweep,
    and with them the folders they saw as /dev/shm; a live worker's stays."""
    from magpie.supervision import scratch as scratch_folders

    if not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    live = scratch_folders.make("live-")
    dead = scratch_folders.make("dead-", owner=2**22 + 1)  # no such process
    orphan = scratch_folders.lent_folder(Path(f"w-{uuid.uuid4().hex[:8]}"), make=True)  # its scratch never was
    lent = [scratch_folders.lent_folder(folder, make=True) for folder in (live, dead)]
    try:
        scratch_folders.sweep()
        assert lent[0].is_dir() and live.is_dir()
        assert not dead.exists() and not lent[1].exists() and not orphan.exists()
    finally:
        scratch_folders.remove(live)
        shutil.rmtree(orphan, ignore_errors=True)


def test_a_host_without_shared_memory_to_lend_in_starts_gpu_workers_all_the_same(tmp_path, monkeypatch):
    """Where no folder can be made in /dev/shm (none, or not writable), a GPU worker's sandbox
    gets an empty tmpfs there: the worker starts, and memory lent to it fails to map in one
    line that says to pass inputs as files, instead of the evaluator failing to start it."""
    from magpie.supervision import scratch as scratch_folders
    from magpie.supervision import shared_memory

    monkeypatch.setattr(scratch_folders, "SHARED_MEMORY", tmp_path / "no-such-folder")
    assert shared_memory.Lending.for_worker(tmp_path / "w-scratch") is None


def test_what_a_gpu_sandbox_writes_in_its_shared_memory_counts_against_its_limit(tmp_path):
    """Its /dev/shm lies in the host's, which is memory: what it writes there is counted with
    its scratch folder, and the sandbox is ended once they hold more than `written_mb`."""
    from magpie.supervision import scratch as scratch_folders

    if not os.path.isdir(sandbox.SHARED_MEMORY):
        pytest.skip("no shared memory folder on this host")
    own = scratch_folders.make("own-")
    try:
        (tmp_path / "fills.py").write_text(FILLS)
        policy = sandbox.Policy(
            write=[str(own)],
            read=[str(tmp_path)],
            gpu=True,
            written_mb=64,
            shared_memory=str(scratch_folders.lent_folder(own, make=True)),
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "magpie.sandbox",
                json.dumps(policy.to_json()),
                "--",
                sys.executable,
                str(tmp_path / "fills.py"),
                sandbox.SHARED_MEMORY,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == sandbox.SANDBOX_LIMIT, (proc.returncode, proc.stderr)
        assert "its folders held more than 64 MiB" in proc.stderr
    finally:
        scratch_folders.remove(own)


def test_links_planted_in_a_workers_scratch_are_not_followed(tmp_path):
    """The evaluator writes a worker's inputs into, and reads its log from, the worker's own
    scratch folder, where code under test may plant links: followed, the inputs overwrote a
    file of the project (any file magpie may write), and a secret in the home folder, which
    the sandbox hides, reached the stored log."""
    token = uuid.uuid4().hex  # the secret's content: its name is in the candidate's source, which is stored
    secret = Path.home() / f".magpie-test-secret-{uuid.uuid4().hex}"
    source = (REPO / "tests/fixtures/adversarial/plants_links.py").read_text().replace("{secret}", str(secret))
    (tmp_path / "plants_links.py").write_text(source)
    (tmp_path / "victim.txt").write_text("victim")
    secret.write_text(f"key-{token}")
    try:
        report = relu2_report(tmp_path, ["plants_links"], shapes="[[33, 65]]")
        assert secret.read_text() == f"key-{token}"  # not emptied through the link either
    finally:
        secret.unlink()
    assert (tmp_path / "victim.txt").read_text() == "victim"
    leaked = [p for p in (tmp_path / "workspaces").rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaked == []
    assert any(r["implementation"] == "plants_links" for r in report["results"])


def test_an_output_file_that_is_a_link_is_the_workers_failure(tmp_path):
    report = relu2_report(tmp_path, ["links_its_outputs"], shapes="[[33, 65]]")
    row = next(r for r in report["results"] if r["implementation"] == "links_its_outputs")
    assert row["correctness_state"] == "FAILED"
    assert any("is not a regular file of its own" in e and "evaluator error" not in e for e in row["errors"]), row[
        "errors"
    ]


def test_a_new_triton_cache_is_seeded_with_magpies_driver_utilities_and_a_changed_copy_put_right(tmp_path):
    """What magpie compiled itself (Triton's driver utilities) is copied into each
    implementation's cache, so no worker compiles it (0.3-0.4 s of a first call on the H200);
    a copy that code under test changed in its own cache is replaced whole for the next
    worker, and a file Triton was still writing into the template is not copied."""
    from magpie.harness.compiler_caches import seed_from

    template, cache = tmp_path / "template", tmp_path / "cache"
    (template / "KEY").mkdir(parents=True)
    (template / "KEY" / "cuda_utils.so").write_bytes(b"compiled by magpie")
    (template / "KEY" / "tmp.pid_7_1").mkdir()
    (template / "KEY" / "tmp.pid_7_1" / "cuda_utils.so").write_bytes(b"half")
    seed_from(template, cache)
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) == ["KEY/cuda_utils.so"]
    (cache / "KEY" / "cuda_utils.so").write_bytes(b"changed by a candidate")
    (cache / "KERNEL").mkdir()
    (cache / "KERNEL" / "scale.cubin").write_bytes(b"the candidate's own")
    seed_from(template, cache)
    assert (cache / "KEY" / "cuda_utils.so").read_bytes() == b"compiled by magpie"
    assert (cache / "KERNEL" / "scale.cubin").read_bytes() == b"the candidate's own"
    assert sorted(p.name for p in (cache / "KEY").iterdir()) == ["cuda_utils.so"]  # no part left


def test_a_host_found_to_allow_a_sandbox_is_not_tried_again_until_it_changes(tmp_path, monkeypatch):
    """The fork that sets a sandbox up runs once; later builds of the user read its word in
    the private lock folder, until what the answer depends on changes (here a user-namespace
    switch); a host that allows none leaves no word."""
    import tempfile

    switch = tmp_path / "unprivileged_userns_clone"
    switch.write_text("1\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    from magpie.sandbox import admission

    monkeypatch.setattr(admission, "USER_NAMESPACE_SWITCHES", (str(switch),))
    tried = []
    real = admission._tried

    def counted():
        tried.append(1)
        return real()

    monkeypatch.setattr(admission, "_tried", counted)
    for _ in range(3):
        sandbox.unavailable_reason.cache_clear()
        assert sandbox.unavailable_reason() is None
    assert len(tried) == 1
    switch.write_text("0\n")
    sandbox.unavailable_reason.cache_clear()
    monkeypatch.setattr(admission, "_tried", lambda: tried.append(1) or "namespaces: not allowed")
    assert sandbox.unavailable_reason() == "namespaces: not allowed" and len(tried) == 2
    sandbox.unavailable_reason.cache_clear()
    assert sandbox.unavailable_reason() == "namespaces: not allowed" and len(tried) == 3  # no word left of it
    sandbox.unavailable_reason.cache_clear()
