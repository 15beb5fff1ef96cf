"""The device nodes a sandbox may open: the byte sources and sinks, and on a GPU project its
GPUs' nodes (all of them, or those a policy names by their minor numbers)."""

from __future__ import annotations

import os
import re
import stat

from magpie.linux import procfs
from magpie.sandbox.policy import Policy

# The device nodes code under test may open: the byte sources and sinks; a GPU's nodes only for
# a GPU project. Nothing else: as root, a process in the sandbox could otherwise open a loop
# device's blocks, /dev/kvm or btrfs-control for writing, or a terminal (TIOCSTI types into
# it).
DEVICES = ("null", "zero", "full", "random", "urandom")


def device_files(policy: Policy) -> list[str]:
    """The device nodes the sandbox may use (DEVICES); for a GPU project also the GPU's nodes:
    work a CPU project's code sent to a GPU would escape the CPU time that times it."""
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    found = [
        os.path.join("/dev", n)
        for n in names
        if (n in DEVICES or (policy.gpu and _is_gpu_node(n) and _one_of_its_gpus(n, policy.gpu_minors)))
        and _is_device(os.path.join("/dev", n))
    ]
    return found


def _is_gpu_node(name: str) -> bool:
    """A GPU's device node or folder of them: NVIDIA's, AMD's compute (kfd), DRM's render and
    card nodes (dri), compute accelerators (accel)."""
    return name.startswith("nvidia") or name in ("kfd", "dri", "accel")


# The node of one NVIDIA GPU, named by its minor number; the others (nvidiactl, nvidia-uvm, ...)
# all GPUs share.
NVIDIA_GPU_NODE = re.compile(r"nvidia(\d+)")


def nvidia_gpu_nodes() -> list[str]:
    """The host's NVIDIA GPUs' own nodes (/dev/nvidiaN)."""
    try:
        return [n for n in os.listdir("/dev") if NVIDIA_GPU_NODE.fullmatch(n)]
    except OSError:
        return []


def _one_of_its_gpus(name: str, minors: list[int] | None) -> bool:
    """Whether a GPU node is usable under a policy that names its GPUs: the nodes all GPUs
    share are; a GPU's own only if its minor number is one of them."""
    own = NVIDIA_GPU_NODE.fullmatch(name)
    return minors is None or own is None or int(own.group(1)) in minors


def nvidia_minor(uuid: str) -> int | None:
    """The minor number of the node (/dev/nvidiaN) of the NVIDIA GPU with this UUID (with or
    without its "GPU-" prefix), from the driver's own description; None where the driver says
    nothing of it."""
    wanted = uuid.lower().removeprefix("gpu-")
    for fields in procfs.nvidia_gpu_descriptions():
        told = fields.get("GPU UUID", "").strip().lower().removeprefix("gpu-")
        if told == wanted and fields.get("Device Minor", "").strip().isdigit():
            return int(fields["Device Minor"])
    return None


def _is_device(path: str) -> bool:
    """A character device or a folder of them; not a link (/dev/stdin and friends point at
    descriptors, which Landlock rules cannot name)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISDIR(mode)
