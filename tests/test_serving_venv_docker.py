"""Docker mode from a virtual environment (issue 40.5): the README's docker example, its own words, run by a shell
whose `python` and `magpie` are a venv's (`python -m venv --system-site-packages`, magpie installed into it with
`pip install --no-index --no-build-isolation -e`, offline), as root and as a user who is not root. The image
`python -m magpie.serving.env_image` builds there must run the venv's interpreter as the venv (its `pyvenv.cfg`)
and find console scripts of the base's distributions; every output belongs to whoever ran magpie.

The user is uid:gid 4242 with the Docker socket's group, run through `setpriv` in a private mount namespace in
which the root-only home that holds this machine's Python (/root, mode 0700) is opened for it: nothing outside the
test's processes changes. The README's `/tmp/tiny` is replaced by a folder of the test's own; the user's run adds a
small load (`--input-len 32 --output-len 8 --num-prompts 4`) after the README's words, the root run uses them alone.
Needs root (namespaces, setpriv) and a Docker engine: without them the tests fail when CI is set, and are skipped
otherwise."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import editable_venv

from magpie.serving import docker_mode
from magpie.serving.runner import REPORT

REPO = Path(__file__).resolve().parents[1]
REPOSITORY = "magpie-serve-env"  # env_image's images, labelled with their environment's sys.prefix
PREFIX_LABEL = "magpie.env_prefix"
USER = (4242, 4242)
SOCKET = Path("/var/run/docker.sock")
# the first run builds the venv's image (1.3 GB) and serves 20 prompts of the default lengths: 223 s at load 8-9 on the
# 2-core machine and over 300 s at load 10, so the runs' own 900 s is the limit
pytestmark = pytest.mark.timeout(900)


def _unavailable(why: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI needs this: {why}")
    pytest.skip(f"{why}; with CI set this fails instead")


def readme_commands(model: Path) -> tuple[str, str]:
    """The README's tiny-model line and its docker example (both lines), with the model folder replaced."""
    text = (REPO / "README.md").read_text()
    tiny = re.search(r"^python -m magpie\.serving\.tiny_model /tmp/tiny.*$", text, re.M)
    docker = re.search(r"^magpie benchmark transformers .*--run-mode docker.*\\\n.*$", text, re.M)
    assert tiny and docker, "the README's serving example changed: update this test"
    # the lines' trailing comments dropped, so that words can follow them
    return tuple(
        re.sub(r"[ \t]+#[^\n]*", "", line.group(0)).replace("/tmp/tiny", str(model)) for line in (tiny, docker)
    )


@pytest.fixture(scope="module")
def venv():
    if os.geteuid() != 0:
        _unavailable("the venv tests run as root (a user through setpriv in a mount namespace)")
    try:
        client = docker_mode.connect()
    except docker_mode.DockerError as exc:
        _unavailable(f"no Docker engine ({exc})")
    # outside pytest's root-only temporary folder: the user must reach the venv
    root = Path(tempfile.mkdtemp(prefix="magpie-venv-test-"))
    root.chmod(0o755)
    prefix = editable_venv(root / "venv")
    yield prefix
    for image in client.images.list(REPOSITORY, filters={"label": f"{PREFIX_LABEL}={prefix}"}):
        client.images.remove(image.id, force=True)  # 1.3 GB, of this venv alone
    shutil.rmtree(root)


def _shell(venv: Path, home: Path) -> dict[str, str]:
    """What an activated venv's shell has: its bin first on PATH."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }


def _owners(folder: Path) -> set[tuple[int, int]]:
    return {(p.lstat().st_uid, p.lstat().st_gid) for p in [folder, *folder.rglob("*")]}


def _check(out: Path, owner: tuple[int, int], proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / REPORT).read_text())
    assert report["success"] and report["server"]["mode"] == "docker", report["errors"]
    assert report["provenance"]["image"].startswith(f"{REPOSITORY}:") and report["provenance"]["engine_version"]
    assert _owners(out) == {owner}
    return report


def test_the_readme_docker_example_from_a_venv_as_root(venv):
    work = Path(tempfile.mkdtemp(prefix="magpie-venv-root-"))
    try:
        tiny, docker = readme_commands(work / "tiny")
        proc = subprocess.run(
            ["bash", "-ec", f"{tiny}\n{docker}"],
            cwd=work,
            env=_shell(venv, work),
            capture_output=True,
            text=True,
            timeout=900,
        )
        report = _check(work / "results" / "tiny-docker", (0, 0), proc)
        assert report["run"]["completed"] == 20
    finally:
        shutil.rmtree(work)


def test_the_readme_docker_example_from_a_venv_as_a_user(venv):
    work = Path(tempfile.mkdtemp(prefix="magpie-venv-user-"))
    try:
        os.chown(work, *USER)
        tiny, docker = readme_commands(work / "tiny")
        as_user = f"{tiny}\n{docker} --input-len 32 --output-len 8 --num-prompts 4"
        # Python under a home only root may enter (here /root, 0700): in a private mount namespace a 0755 tmpfs
        # over that home and the Python tree bound back in place; then the user's shell with no capability
        python_home = Path(sys.base_prefix).resolve()
        closed = next(
            (p for p in python_home.parents if p != Path("/") and not os.stat(p).st_mode & stat.S_IXOTH), None
        )
        opened = (
            ""
            if closed is None
            else f"""
            kept={work}/.python-home
            mkdir "$kept"
            mount --bind {python_home} "$kept"
            mount -t tmpfs -o mode=0755 none {closed}
            mkdir -p {python_home}
            mount --bind "$kept" {python_home}
        """
        )
        script = f"""{opened}
            cd {work}
            exec setpriv --reuid={USER[0]} --regid={USER[1]} --groups={SOCKET.stat().st_gid} --inh-caps=-all \\
                env -i {" ".join(f"{k}={v}" for k, v in _shell(venv, work).items())} bash -ec "$0"
        """
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-ec", script, as_user],
            capture_output=True,
            text=True,
            timeout=900,
        )
        out = work / "results" / "tiny-docker"
        report = _check(out, USER, proc)
        assert report["run"]["completed"] == 4
        assert f"--user {USER[0]}:{USER[1]}" in (out / "server.log").read_text().splitlines()[0]
    finally:
        shutil.rmtree(work)
