"""Docker run mode: an engine's server in a container of its image, and its end.

`prepare` does everything that can fail before a container exists, each failure one `DockerError` line:
the docker SDK imported (lazily: `import magpie` never imports it) and the daemon reached (`DOCKER_HOST`,
else the local socket), the accelerator told (`/dev/kfd`: ROCm; an NVIDIA GPU found or `/dev/nvidiactl`:
NVIDIA; else the CPU), the image picked (`--docker-image`, else `images.yaml` beside this module, per engine
and accelerator) and found on this machine (nothing is pulled: our machines reach no registry), and the
container's settings (`container_settings`):

- `--network host`, so the server listens where local mode's would and the same health route is polled;
- the model (read-only) and the workspace (read-write, the working folder) mounted at their own paths, so
  the engine's command line, the profiler's trace folder and the report name the same paths inside and out;
- NVIDIA: a device request for the allocated GPUs (`--gpus "device=2,3"`), which the container sees as
  0..n-1, so the `CUDA_VISIBLE_DEVICES` chosen for a local server is not passed in; ROCm: `/dev/kfd` and
  `/dev/dri` with the groups that own them (video, render: by number, whatever the image's /etc/group says),
  `HIP_VISIBLE_DEVICES` set to the allocated devices (every device is visible), seccomp unconfined as ROCm's
  images ask;
- `--ipc host` (tensor-parallel workers share memory through it), docker's init as PID 1 (a signal reaches
  the server and its children are reaped), the engine's environment and no other of the host's;
- the user: the invoking user's uid:gid (`run_as: invoking_user`, with HOME=/tmp) or the image's (root);
- labels naming the workspace and the magpie process that owns the container (pid, its start time, the host), so
  that `sweep` (before each docker run starts its container, and `--stop-servers`) removes a container whose
  magpie was killed (SIGKILL) before it could, and never one of a magpie that still runs.

`DockerServer` has `LocalServer`'s life: `start` (port check, create, start; the container's output
streamed into `server.log` by a thread), `wait_ready` (the health route, the container's exit with the
log's tail, or the timeout), `alive`/`exit_code` (from a thread waiting on the container, so a check costs
no request to the daemon while the load runs), `stop` (`docker stop`: SIGTERM, then SIGKILL after the
grace; then the container removed), and `give_back` (files in the workspace not owned by the invoking
user are given to them: `os.lchown` where magpie is root, else `chown -R` in a short container of the
same image run as root). `image_id` is what a declared `[[benchmark]]` in docker mode is keyed by.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from magpie.serving.local import ServerError, port_in_use, tail, wait_healthy

IMAGES = Path(__file__).with_name("images.yaml")
Accelerator = Literal["nvidia", "rocm", "cpu"]
LABEL = "magpie.workspace"
CONTAINER_HOME = "/tmp"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY", re.IGNORECASE)


class DockerError(RuntimeError):
    """Docker mode cannot run: no SDK, no daemon, no image, or the daemon refused; one line."""


class ImageEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str
    verified: bool = False


class EngineImages(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_as: Literal["invoking_user", "root"] = "root"
    images: dict[Accelerator, ImageEntry] = {}


def image_table(path: Path = IMAGES) -> dict[str, EngineImages]:
    import yaml

    return {name: EngineImages.model_validate(entry) for name, entry in yaml.safe_load(path.read_text()).items()}


def invoking_user(environ=os.environ) -> tuple[int, int]:
    """(uid, gid) of whoever ran magpie: under sudo, the user who ran sudo; else this process's."""
    if os.geteuid() == 0 and environ.get("SUDO_UID", "").isdigit() and environ.get("SUDO_GID", "").isdigit():
        return int(environ["SUDO_UID"]), int(environ["SUDO_GID"])
    return os.getuid(), os.getgid()


def accelerator(allocation: dict, dev: Path = Path("/dev")) -> Accelerator:
    """The kind of GPU the container gets: the allocation's source where a GPU was found, else the device files."""
    source = allocation.get("source", "")
    if source == "amdsmi" or (dev / "kfd").exists():
        return "rocm"
    if source in ("nvml", "nvidia-smi") or (dev / "nvidiactl").exists():
        return "nvidia"
    return "cpu"


def connect():
    """A docker client whose daemon answered; DockerError naming where it looked otherwise."""
    try:
        import docker
    except ImportError:
        raise DockerError("docker mode needs the docker Python package: pip install -e '.[serve]'") from None
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        reason = " ".join(str(exc).split())
        raise DockerError(
            f"cannot reach the Docker daemon at {where} ({reason}); start dockerd, or point "
            f"DOCKER_HOST at a running one"
        ) from None
    return client


def pick_image(engine: str, kind: Accelerator, override: str | None, table: dict[str, EngineImages]) -> str:
    if override:
        return override
    entry = table.get(engine, EngineImages()).images.get(kind)
    if entry is None:
        raise DockerError(
            f"{IMAGES.name} has no {engine} image for {kind}: give --docker-image IMG (for "
            f"transformers, `python -m magpie.serving.env_image` builds one from this Python environment)"
        )
    return entry.image


def find_image(client, ref: str):
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise DockerError(
            f"image {ref} is not on this machine (magpie pulls nothing; our machines reach no "
            f"registry): build it (python -m magpie.serving.env_image for transformers), or docker "
            f"pull / docker load it"
        ) from None
    except docker.errors.APIError as exc:
        raise DockerError(f"docker: looking up image {ref}: {exc.explanation or exc}") from None


def _device_groups(paths: list[Path]) -> list[str]:
    return sorted({str(p.stat().st_gid) for p in paths if p.exists()})


def owner_labels() -> dict[str, str]:
    """This magpie process as a container's owner: a pid is another process once its start time differs."""
    from magpie.linux.procfs import start_time

    pid = os.getpid()
    return {"magpie.pid": str(pid), "magpie.pid_start": str(start_time(pid) or 0), "magpie.host": socket.gethostname()}


def sweep(client) -> list[str]:
    """Removes the containers of this host's magpie runs whose magpie is gone; a line for each, naming it."""
    import docker

    from magpie.linux.procfs import start_time

    try:
        found = client.containers.list(all=True, filters={"label": [f"magpie.host={socket.gethostname()}"]})
    except docker.errors.DockerException:
        return []  # the run's own start says what is wrong with the daemon
    lines = []
    for container in found:
        labels = container.labels
        pid, start = labels.get("magpie.pid", ""), labels.get("magpie.pid_start", "")
        if not (pid.isdigit() and start.isdigit()) or start_time(int(pid)) == int(start):
            continue
        what = f"container {container.short_id} ({container.attrs['Config']['Image']}, workspace {labels.get(LABEL)})"
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.DockerException as exc:
            lines.append(
                f"could not remove {what}, left by magpie pid {pid}, which is gone: "
                f"{' '.join(str(exc).split())}; remove it with docker rm -f"
            )
            continue
        lines.append(f"removed {what}, left by magpie pid {pid}, which is gone")
    return lines


def container_settings(
    *,
    image: str,
    command: list[str],
    env: dict[str, str],
    workspace: Path,
    model_path: Path | None,
    kind: Accelerator,
    devices: list,
    user: tuple[int, int] | None,
    dev: Path = Path("/dev"),
) -> dict:
    """The keyword arguments of `containers.create` (docker SDK) for a server; pure apart from /dev's owners."""
    from docker.types import DeviceRequest

    env = dict(env)
    volumes = {str(workspace): {"bind": str(workspace), "mode": "rw"}}
    if model_path is not None:
        volumes[str(model_path)] = {"bind": str(model_path), "mode": "ro"}
    settings = dict(
        image=image,
        entrypoint=list(command),
        command=None,
        environment=env,
        volumes=volumes,
        working_dir=str(workspace),
        network_mode="host",
        ipc_mode="host",
        init=True,
        detach=True,
        labels={LABEL: str(workspace), **owner_labels()},
    )
    if kind == "nvidia":
        for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
            env.pop(name, None)  # the container sees only the requested GPUs, numbered from 0
        request = (
            DeviceRequest(device_ids=[str(d) for d in devices], capabilities=[["gpu"]])
            if devices
            else DeviceRequest(count=-1, capabilities=[["gpu"]])
        )
        settings["device_requests"] = [request]
    elif kind == "rocm":
        nodes = [dev / "kfd", dev / "dri"]
        settings["devices"] = [f"{p}:{p}:rwm" for p in nodes]
        settings["group_add"] = _device_groups([nodes[0], *sorted((dev / "dri").glob("*"))])
        settings["security_opt"] = ["seccomp=unconfined"]
        if devices:  # pinned in magpie's own environment: the container has its own
            env.setdefault("HIP_VISIBLE_DEVICES", ",".join(map(str, devices)))
    if user is not None:
        settings["user"] = f"{user[0]}:{user[1]}"
        env.setdefault("HOME", CONTAINER_HOME)  # no passwd entry for it in the image: a HOME it may write
    return settings


def describe(settings: dict) -> str:
    """The settings as the `docker run` command line they amount to (the first line of server.log)."""
    import shlex

    words = ["docker", "run", "--network", "host", "--ipc", "host", "--init", "-w", settings["working_dir"]]
    if "user" in settings:
        words += ["--user", settings["user"]]
    for request in settings.get("device_requests", []):
        ids = request.get("DeviceIDs") or []
        words += ["--gpus", f"device={','.join(ids)}" if ids else "all"]
    for device in settings.get("devices", []):
        words += ["--device", device]
    for group in settings.get("group_add", []):
        words += ["--group-add", group]
    for src, bind in settings["volumes"].items():
        words += ["-v", f"{src}:{bind['bind']}:{bind['mode']}"]
    for name, value in settings["environment"].items():
        words += ["-e", f"{name}={'***' if SECRET_NAME.search(name) else value}"]  # server.log is shared freely
    words += ["--entrypoint", settings["entrypoint"][0], settings["image"], *settings["entrypoint"][1:]]
    return shlex.join(words)


@dataclass
class Prepared:
    """What `prepare` found: the client, the image, the accelerator and how the engine runs in it."""

    client: object
    image: str
    image_id: str
    kind: Accelerator
    run_as: Literal["invoking_user", "root"]
    owner: tuple[int, int]
    devices: list = field(default_factory=list)


def prepare(engine: str, override: str | None, allocation: dict) -> Prepared:
    table = image_table()
    kind = accelerator(allocation)
    ref = pick_image(engine, kind, override, table)
    client = connect()
    image = find_image(client, ref)
    return Prepared(
        client=client,
        image=ref,
        image_id=image.id,
        kind=kind,
        run_as=table.get(engine, EngineImages()).run_as,
        owner=invoking_user(),
        devices=list(allocation.get("devices") or []),
    )


def image_id(engine: str, override: str | None) -> str | None:
    """The content id of the image docker mode would run `engine` in here; None where there is none to ask."""
    try:
        return find_image(connect(), pick_image(engine, accelerator({}), override, image_table())).id
    except DockerError:
        return None


class DockerServer:
    """A server command run in a container of `prepared.image`, its output in `log_path`."""

    pid = None  # no process of ours: the server is the container's (`container_id`)

    def __init__(
        self,
        prepared: Prepared,
        command: list[str],
        *,
        env: dict[str, str],
        log_path: str | Path,
        host: str,
        port: int,
        health_url: str,
        workspace: Path,
        model_path: Path | None,
    ) -> None:
        self.prepared = prepared
        self.log_path = Path(log_path)
        self.host, self.port, self.health_url = host, port, health_url
        self.workspace = workspace
        user = prepared.owner if prepared.run_as == "invoking_user" and prepared.owner != (0, 0) else None
        self.settings = container_settings(
            image=prepared.image,
            command=command,
            env=env,
            workspace=workspace,
            model_path=model_path,
            kind=prepared.kind,
            devices=prepared.devices,
            user=user,
        )
        self.container = None
        self.started_at = 0.0
        self.ready_after: float | None = None
        self._exit: int | None = None
        self._exited = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cleanup_errors: list[str] = []

    @property
    def container_id(self) -> str | None:
        return self.container.id if self.container is not None else None

    # -- life
    def start(self) -> DockerServer:
        import docker

        if port_in_use(self.host, self.port):
            raise ServerError(
                f"port {self.port} on {self.host} is already taken (another server?); stop it or choose another port"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(("$ " + describe(self.settings) + "\n").encode())
        try:
            self.container = self.prepared.client.containers.create(**self.settings)
            self.container.start()
        except docker.errors.APIError as exc:
            raise ServerError(
                f"docker could not start the container of {self.prepared.image}: "
                f"{' '.join(str(exc.explanation or exc).split())}"
            ) from None
        self.started_at = time.monotonic()
        for target in (self._copy_logs, self._wait_container):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _copy_logs(self) -> None:
        import docker

        try:
            with open(self.log_path, "ab", buffering=0) as log:
                for chunk in self.container.logs(stream=True, follow=True):
                    log.write(chunk)
        except (docker.errors.DockerException, OSError):
            pass  # the container is gone: what was logged is in the file

    def _wait_container(self) -> None:
        import docker

        try:
            self._exit = self.container.wait()["StatusCode"]
        except (docker.errors.DockerException, OSError):
            self._exit = None
        finally:
            self._exited.set()

    def alive(self) -> bool:
        return self.container is not None and not self._exited.is_set()

    def exit_code(self) -> int | None:
        return self._exit if self._exited.is_set() else None

    def wait_exit(self, timeout_s: float) -> int | None:
        if self.container is None:
            return None
        self._exited.wait(timeout_s)
        return self.exit_code()

    def _log_tail(self) -> str:
        for thread in self._threads[:1]:
            thread.join(timeout=5)  # the log stream ends with the container: the tail is complete
        return tail(self.log_path)

    def wait_ready(self, timeout_s: float, interval_s: float = 0.25) -> float:
        """Seconds until the health route answered 200; raises ServerError on the container's exit or timeout."""
        return wait_healthy(self, timeout_s, interval_s, who="the server's container", log_tail=self._log_tail)

    def engine_version(self, package: str | None) -> str | None:
        """The engine's version as installed in the image (asked of the running container), None if unknown."""
        if package is None or not self.alive():
            return None
        import docker

        probe = f"import importlib.metadata as m; print(m.version({package!r}))"
        for python in ("python3", "python"):
            try:
                code, out = self.container.exec_run([python, "-c", probe])
            except docker.errors.DockerException:
                return None
            if code == 0:
                return out.decode().strip() or None
        return None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """`docker stop` (SIGTERM, SIGKILL after `grace_s`), the container removed, the workspace given back to
        the invoking user; the container's exit code. What failed is in `cleanup_errors()`, never raised: the
        caller is on its way to writing the report."""
        if self.container is None:
            return None
        import docker

        try:
            if not self._exited.is_set():
                self.container.stop(timeout=max(int(grace_s), 0))
            self._exited.wait(5)
        except docker.errors.DockerException:
            pass  # already gone or the daemon went away: the removal below says which
        for thread in self._threads:
            thread.join(timeout=5)
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            self._cleanup_errors.append(
                f"docker could not remove container {self.container.short_id}: "
                f"{' '.join(str(exc).split())}; remove it with docker rm -f"
            )
        try:
            give_back(self.workspace, self.prepared.owner, self.prepared)
        except DockerError as exc:
            self._cleanup_errors.append(str(exc))
        return self.exit_code()

    def cleanup_errors(self) -> list[str]:
        return list(self._cleanup_errors)


def not_owned(root: Path, owner: tuple[int, int]) -> list[Path]:
    paths = [root, *root.rglob("*")] if root.exists() else []
    out = []
    for p in paths:
        st = p.lstat()
        if (st.st_uid, st.st_gid) != owner:
            out.append(p)
    return out


def give_back(root: Path, owner: tuple[int, int], prepared: Prepared | None = None) -> None:
    """`root`'s tree owned by `owner`: lchown where we are root, else `chown -R` in a root container of the image."""
    strays = not_owned(root, owner)
    if not strays:
        return
    if os.geteuid() == 0:
        for p in strays:
            os.lchown(p, *owner)
        return
    if prepared is None:
        raise DockerError(
            f"{len(strays)} files in {root} are not owned by uid {owner[0]}, and no image is at hand to chown them in"
        )
    import docker

    try:
        prepared.client.containers.run(
            prepared.image,
            entrypoint=["chown", "-R", f"{owner[0]}:{owner[1]}", str(root)],
            command=None,
            user="0:0",
            remove=True,
            network_mode="none",
            volumes={str(root): {"bind": str(root), "mode": "rw"}},
            labels={LABEL: str(root), **owner_labels()},
        )
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"{len(strays)} files the container wrote in {root} stay root's: chown in "
            f"{prepared.image} failed ({' '.join(str(exc).split())}); remove them with sudo"
        ) from None
