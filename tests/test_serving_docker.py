"""Docker run mode against the real Docker engine of this machine: `transformers serve` in a container of an image
assembled offline from this Python environment (magpie.serving.env_image; no registry is reached), serving the tiny
offline model, benchmarked through `magpie benchmark transformers --run-mode docker`. Run as root, the tests play a
user who ran magpie under sudo (SUDO_UID/SUDO_GID 4321): the container runs as that user and every workspace file
must end up theirs. A `[[benchmark]]` table with `run_mode = "docker"` built, keyed by the image's ID and cached.
Also: each failure path (daemon unreachable, image missing, container exits during start, SIGTERM mid-run) is one
line and a written report with no container left; a container whose magpie was killed with SIGKILL is removed by
`--stop-servers`, and one whose magpie still runs is not; root-written outputs given back through a root container of
the image; the container settings of NVIDIA and AMD GPUs (unverified on a GPU: no GPU here).

Without a reachable Docker engine the tests that need one fail when CI is set, and are skipped otherwise."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from magpie.cli import main
from magpie.serving import docker_mode, engines
from magpie.serving.bench_config import load_benchmark_config
from magpie.serving.local import free_port
from magpie.serving.runner import REPORT

INVOKER = (4321, 4321) if os.geteuid() == 0 else (os.getuid(), os.getgid())


@pytest.fixture(scope="module")
def client():
    try:
        return docker_mode.connect()
    except docker_mode.DockerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a Docker engine: {exc}")
        pytest.skip(f"no Docker engine here ({exc}); with CI set this fails instead")


@pytest.fixture(scope="module")
def image(client):
    from magpie.serving.env_image import ensure

    return ensure(client)


@pytest.fixture(scope="module")
def tiny_model(tiny_model, tmp_path_factory):
    """The session's tiny model, a copy of it owned by the user the container runs as."""
    path = shutil.copytree(tiny_model, tmp_path_factory.mktemp("tiny") / "model")
    if os.geteuid() == 0:  # the user's own model, readable by the container's user
        for p in [path, *path.rglob("*")]:
            os.lchown(p, *INVOKER)
    return path


@pytest.fixture
def as_sudo_user(monkeypatch):
    if os.geteuid() == 0:
        monkeypatch.setenv("SUDO_UID", str(INVOKER[0]))
        monkeypatch.setenv("SUDO_GID", str(INVOKER[1]))


def in_docker(model, image: str, *options: str) -> list[str]:
    """`magpie benchmark transformers`'s arguments serving the model in a container of the image, then the options."""
    return ["benchmark", "transformers", "-m", str(model), "--run-mode", "docker", "--docker-image", image, *options]


def left(client, workspace: Path) -> list:
    # one removed between the listing and its inspection (magpie removing it meanwhile) is not left
    return client.containers.list(all=True, filters={"label": f"{docker_mode.LABEL}={workspace}"}, ignore_removed=True)


def not_theirs(workspace: Path) -> list[str]:
    return [str(p) for p in [workspace, *workspace.rglob("*")] if (p.lstat().st_uid, p.lstat().st_gid) != INVOKER]


def test_transformers_serve_in_a_container_end_to_end(client, image, tiny_model, tmp_path, as_sudo_user):
    import transformers

    out = tmp_path / "ws"
    rc = main(
        in_docker(
            tiny_model,
            image,
            "--port",
            str(free_port()),
            "--num-prompts",
            "6",
            "--concurrency",
            "3",
            "--input-len",
            "16",
            "--output-len",
            "12",
            "--num-warmups",
            "1",
            "--timeout",
            "240",
            "-o",
            str(out),
        )
    )
    report = json.loads((out / REPORT).read_text())
    assert rc == 0, report["errors"]
    assert report["success"] and report["errors"] == [] and report["config"]["run_mode"] == "docker"
    assert report["run"]["completed"] == 6 and report["run"]["failed"] == 0
    assert report["run"]["total_output_tokens"] == 6 * 12
    lat = report["latency"]
    assert 0 < lat["ttft"]["mean_ms"] <= lat["e2el"]["mean_ms"]
    assert lat["tpot"]["mean_ms"] > 0 and lat["itl"]["p99_ms"] > 0
    prov, server = report["provenance"], report["server"]
    assert prov["image"] == image and prov["image_id"] == client.images.get(image).id
    assert prov["engine_version"] == transformers.__version__  # asked of the container
    assert prov["environment"] == {"HF_HUB_OFFLINE": "1"}  # the container's, none of ours
    assert server["mode"] == "docker" and server["container"] and server["ready_after_s"] > 0
    assert server["command"][:2] == ["transformers", "serve"]
    log = (out / "server.log").read_text()
    assert (
        log.startswith("$ docker run --network host")
        and f"--user {INVOKER[0]}:{INVOKER[1]}" in log.splitlines()[0]
        or INVOKER == (0, 0)
    )
    statuses = re.findall(r'"POST /v1/\S+ HTTP/[\d.]+" (\d{3})', log)
    assert statuses and set(statuses) == {"200"}, statuses
    assert left(client, out) == []
    assert not_theirs(out) == []


def test_declared_docker_benchmark_is_built_and_keyed_by_its_image(client, image, tiny_model, tmp_path):
    from conftest import build_json

    from magpie.graph.expand import expand
    from magpie.graph.rules import builtin_rules
    from magpie.manifest.load import load_manifest

    shutil.copytree(tiny_model, tmp_path / "models" / "tiny")  # a project reads only files inside it
    (tmp_path / "magpie.toml").write_text(f"""[project]
name = "docker-serving"

[[benchmark]]
id = "tiny"
engine = "transformers"
model = "models/tiny"
run_mode = "docker"
docker_image = "{image}"
port = {free_port()}
timeout_s = 240
load = {{concurrency = 2, input_len = 8, output_len = 4, num_prompts = 3}}
""")
    first = build_json(tmp_path)
    assert "benchmark:tiny" in first["executed"] and first["failed"] == [], first
    stored = next((tmp_path / "workspaces" / "store").rglob("benchmark_report.json"))
    report = json.loads(stored.read_text())
    assert report["success"] and report["server"]["mode"] == "docker" and report["run"]["total_output_tokens"] == 12
    manifest, root = load_manifest(tmp_path / "magpie.toml")
    spec = expand(manifest, root, [r for r in builtin_rules() if r.name == "benchmark"])
    assert spec["benchmark:tiny"].config["benchmark"]["image_id"] == client.images.get(image).id
    assert build_json(tmp_path)["executed"] == []
    labelled = client.containers.list(all=True, filters={"label": docker_mode.LABEL})
    assert [c for c in labelled if c.labels[docker_mode.LABEL].startswith(str(tmp_path))] == []


def test_daemon_unreachable_is_one_line_and_a_report(tmp_path, monkeypatch, capsys):
    dead = tmp_path / "dead.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    out = tmp_path / "ws"
    rc = main(in_docker(tmp_path, "any:1", "--timeout", "30", "-o", str(out)))
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"magpie: benchmark failed: docker mode: cannot reach the Docker daemon at unix://{dead}"
    )
    report = json.loads((out / REPORT).read_text())
    assert not report["success"] and "start dockerd" in report["errors"][0]
    assert report["config"]["run_mode"] == "docker" and report["server"] is None


def test_missing_image_is_one_line(client, tmp_path, capsys):
    out = tmp_path / "ws"
    rc = main(in_docker(tmp_path, "magpie-no-such-image:0", "--timeout", "30", "-o", str(out)))
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "image magpie-no-such-image:0 is not on this machine" in err[0] and "docker pull" in err[0]
    report = json.loads((out / REPORT).read_text())
    assert not report["success"] and report["provenance"]["image"] is None


def test_container_that_exits_at_start_leaves_its_log_tail(client, image, tmp_path, capsys, as_sudo_user):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": "wide"}')
    out = tmp_path / "ws"
    rc = main(
        in_docker(broken, image, "--port", str(free_port()), "--num-prompts", "2", "--timeout", "120", "-o", str(out))
    )
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the server's container exited with code 1 before it was ready" in err[0]
    report = json.loads((out / REPORT).read_text())
    assert not report["success"] and "hidden_size" in report["errors"][1]
    assert report["provenance"]["image_id"] == client.images.get(image).id
    assert left(client, out) == [] and not_theirs(out) == []


def test_ready_timeout_and_taken_port_leave_no_container(client, image, tiny_model, tmp_path):
    out = tmp_path / "slow"
    rc = main(
        in_docker(
            tiny_model, image, "--port", str(free_port()), "--ready-timeout", "1", "--timeout", "60", "-o", str(out)
        )
    )
    report = json.loads((out / REPORT).read_text())
    assert rc == 1 and "was not ready within 1 s" in report["errors"][0] and left(client, out) == []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = tmp_path / "taken"
        rc = main(
            in_docker(tiny_model, image, "--port", str(taken.getsockname()[1]), "--timeout", "60", "-o", str(out))
        )
    report = json.loads((out / REPORT).read_text())
    assert rc == 1 and "is already taken" in report["errors"][0] and report["server"]["container"] is None


def test_transformers_profiler_is_refused_in_docker_mode(tmp_path, capsys):
    rc = main(
        [
            "benchmark",
            "transformers",
            "-m",
            str(tmp_path),
            "--run-mode",
            "docker",
            "--torch-profiler",
            "-o",
            str(tmp_path / "ws"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "profiled by magpie's launcher" in err[0] and "local mode" in err[0]


def test_sigterm_mid_run_removes_the_container(client, image, tiny_model, tmp_path):
    out = tmp_path / "ws"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "magpie",
            *in_docker(
                tiny_model,
                image,
                "--port",
                str(free_port()),
                "--num-prompts",
                "400",
                "--concurrency",
                "2",
                "--input-len",
                "16",
                "--output-len",
                "64",
                "--timeout",
                "240",
                "-o",
                str(out),
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"POST /v1/completions' not in _read(out / "server.log"):
        time.sleep(0.25)
    assert left(client, out), "the container should be running"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    report = json.loads((out / REPORT).read_text())
    assert proc.returncode != 0 and not report["success"]
    assert any("interrupted" in e for e in report["errors"]), report["errors"]
    assert left(client, out) == []


def test_a_container_left_by_a_killed_magpie_is_removed_and_a_live_ones_is_not(
    client, image, tiny_model, tmp_path, capsys, monkeypatch
):
    from magpie import environment

    monkeypatch.setenv(environment.SERVER_DIR, str(tmp_path / "servers"))  # the user's kept servers stay
    out = tmp_path / "ws"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "magpie",
            *in_docker(tiny_model, image, "--port", str(free_port()), "--timeout", "240", "-o", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    live = client.containers.run(
        image,
        entrypoint=["python3", "-c", "import time; time.sleep(300)"],
        command=None,
        detach=True,
        network_mode="none",
        labels={docker_mode.LABEL: str(tmp_path / "live"), **docker_mode.owner_labels()},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not left(client, out):
            time.sleep(0.1)
        [container] = left(client, out)
        proc.kill()
        proc.wait()
        assert left(client, out), "SIGKILL: nothing of magpie's removed the container"
        assert main(["benchmark", "--stop-servers"]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines == [
            f"removed container {container.short_id} ({image}, workspace {out}), left by magpie pid "
            f"{proc.pid}, which is gone"
        ]
        assert left(client, out) == [] and left(client, tmp_path / "live") != []
    finally:
        live.remove(force=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_root_written_outputs_are_given_back_through_a_root_container(client, image, tmp_path, monkeypatch):
    work = tmp_path / "ws"
    work.mkdir()
    if os.geteuid() == 0:
        os.chown(work, *INVOKER)
    client.containers.run(
        image,
        entrypoint=[
            "python3",
            "-c",
            "import os; os.makedirs('torch_trace'); open('torch_trace/t.json', 'w').write('{}')",
        ],
        command=None,
        user="0:0",
        remove=True,
        working_dir=str(work),
        volumes={str(work): {"bind": str(work), "mode": "rw"}},
    )
    assert (work / "torch_trace" / "t.json").stat().st_uid == 0
    prepared = docker_mode.Prepared(client=client, image=image, image_id="", kind="cpu", run_as="root", owner=INVOKER)
    monkeypatch.setattr(docker_mode.os, "geteuid", lambda: 1000)  # magpie not root: it cannot chown, the image can
    docker_mode.give_back(work, INVOKER, prepared)
    assert not_theirs(work) == [] and left(client, work) == []


def test_gpu_settings_nvidia_and_amd(tmp_path):
    command, work = ["vllm", "serve", "/m"], tmp_path / "ws"
    nvidia = docker_mode.container_settings(
        image="vllm/vllm-openai:latest",
        command=command,
        env={"CUDA_VISIBLE_DEVICES": "2,3", "VLLM_USE_V1": "1"},
        workspace=work,
        model_path=Path("/m"),
        kind="nvidia",
        devices=[2, 3],
        user=None,
    )
    request = nvidia["device_requests"][0]
    assert request["DeviceIDs"] == ["2", "3"] and request["Capabilities"] == [["gpu"]]
    assert nvidia["environment"] == {"VLLM_USE_V1": "1"}  # renumbered from 0 inside: not passed
    assert nvidia["volumes"]["/m"] == {"bind": "/m", "mode": "ro"} and nvidia["network_mode"] == "host"
    assert nvidia["entrypoint"] == command and "user" not in nvidia
    nvidia["environment"]["HF_TOKEN"] = "hf_secret"
    assert "--gpus device=2,3" in docker_mode.describe(nvidia) and "HF_TOKEN=***" in docker_mode.describe(nvidia)
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    for node in (dev / "kfd", dev / "dri" / "renderD128"):
        node.touch()
    if os.geteuid() == 0:
        os.chown(dev / "dri" / "renderD128", 0, 44)  # the video group owns render nodes
    amd = docker_mode.container_settings(
        image="rocm/vllm:latest",
        command=command,
        env={},
        workspace=work,
        model_path=None,
        kind="rocm",
        devices=[1],
        user=(1000, 1000),
        dev=dev,
    )
    assert amd["devices"] == [f"{dev}/kfd:{dev}/kfd:rwm", f"{dev}/dri:{dev}/dri:rwm"]
    assert set(amd["group_add"]) == {str((dev / "kfd").stat().st_gid), str((dev / "dri" / "renderD128").stat().st_gid)}
    assert amd["security_opt"] == ["seccomp=unconfined"]
    assert amd["environment"] == {"HIP_VISIBLE_DEVICES": "1", "HOME": "/tmp"} and amd["user"] == "1000:1000"
    assert docker_mode.accelerator({"source": "amdsmi"}) == "rocm"
    assert docker_mode.accelerator({"mode": "none"}, dev=tmp_path / "nodev") == "cpu"


def test_image_table_and_config(tmp_path):
    table = docker_mode.image_table()
    assert set(table) == {"transformers", "vllm", "sglang", "atom"}
    assert table["vllm"].images["nvidia"].image.startswith("vllm/") and table["transformers"].run_as == "invoking_user"
    assert docker_mode.pick_image("vllm", "rocm", None, table) == table["vllm"].images["rocm"].image
    assert docker_mode.pick_image("vllm", "cpu", "mine:1", table) == "mine:1"
    with pytest.raises(docker_mode.DockerError, match="no atom image for nvidia: give --docker-image"):
        docker_mode.pick_image("atom", "nvidia", None, table)
    spec = engines.ServerSpec(model="/m")
    assert engines.get("vllm").command(spec, in_image=True)[:3] == ["vllm", "serve", "/m"]
    assert engines.get("sglang").command(spec, in_image=True)[:3] == ["python3", "-m", "sglang.launch_server"]
    assert engines.get("atom").command(spec, in_image=True)[:3] == ["python3", "-m", "atom.entrypoints.openai_server"]
    path = tmp_path / "bench.yaml"
    path.write_text("benchmark: {framework: vllm, model: m, run_mode: docker, docker_image: 'vllm/vllm-openai:v1'}\n")
    config = load_benchmark_config(path)
    assert config.run_mode == "docker" and config.docker_image == "vllm/vllm-openai:v1"


def test_the_docker_sdk_is_imported_only_by_docker_mode():
    code = (
        "import sys, magpie, magpie.cli, magpie.serving.runner, magpie.serving.docker_mode; "
        "print([m for m in ('docker', 'torch') if m in sys.modules])"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_docker_image_without_docker_mode_is_one_line(capsys):
    from pydantic import ValidationError

    from magpie.manifest.models import Manifest

    assert main(["benchmark", "vllm", "-m", "m", "--docker-image", "x:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "docker_image is docker mode's: add --run-mode docker" in err[0]
    with pytest.raises(ValidationError, match="docker_image is docker mode's"):
        Manifest.model_validate({"benchmark": [{"id": "b", "engine": "vllm", "model": "m", "docker_image": "x:1"}]})
