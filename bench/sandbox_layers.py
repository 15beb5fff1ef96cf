"""Which part of the sandbox, if any, stops CUDA on this host: in a fork, the whole sandbox
(`sandbox.contain`) is set up with one part of it left out, then CUDA is initialised and one
kernel runs. Prints one line per variant; "ok" under a variant and an error under "everything"
names the part CUDA needs. Then, where strace is installed, the sockets CUDA opens unsandboxed.
Usage: python bench/sandbox_layers.py"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from magpie import sandbox  # noqa: E402
from magpie.linux import namespaces  # noqa: E402
from magpie.sandbox import containment, landlock, seccomp  # noqa: E402

SCRATCH = tempfile.mkdtemp()
POLICY = sandbox.Policy(write=[SCRATCH], gpu=True)


def without(part: str) -> None:
    """Relax one part of the sandbox in this (forked) process, then contain it."""
    if part == "socket refusal":
        install = seccomp.install
        seccomp.install = lambda network, families=(): install(True)
    elif part.startswith("socket refusal of ") or part.startswith("socket refusal but "):
        family = getattr(socket, part.split()[-1])
        families = (family,) if " but " in part else tuple(f for f in range(64) if f != family)
        install = seccomp.install
        seccomp.install = lambda network, _=(): install(network, families)
    elif part == "seccomp":
        seccomp.supported = lambda: False
    elif part == "device allowlist":
        containment.device_files = lambda policy: ["/dev"]
    elif part == "narrow reads":
        read_trees = containment.read_trees
        containment.read_trees = lambda policy: ["/", *read_trees(policy)]
    elif part == "covered socket folders":
        containment.SOCKET_FOLDERS = ()
    elif part == "covered secrets":
        containment.SECRET_FOLDERS, containment.SECRET_FILES = (), ()
    elif part == "landlock":
        landlock.restrict = lambda **_: None
    elif part == "capability drop":
        namespaces.drop_capabilities = lambda: None
    elif part == "limits":
        containment._limits = lambda policy: None
    if part != "the sandbox":
        sandbox.contain(POLICY)


PARTS = [
    "the sandbox",
    "nothing",
    "socket refusal",
    "socket refusal but AF_UNIX",
    "socket refusal but AF_NETLINK",
    *(f"socket refusal of {family}" for family in ("AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6")),
    "seccomp",
    "device allowlist",
    "narrow reads",
    "covered socket folders",
    "covered secrets",
    "landlock",
    "capability drop",
    "limits",
]


def in_fork(work) -> str:
    """What work() returns (or raises), run in a fork: CUDA is never initialised here."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            message = str(work())
        except BaseException as err:  # noqa: BLE001 - reported
            message = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        told = answer.read()
    os.waitpid(pid, 0)
    return told


def one_gpu_of_several() -> None:
    """On a host of several GPUs: a sandbox that may open one GPU's node only, for each GPU in
    CUDA's order; what CUDA counts in it and whether each GPU runs a kernel."""
    count = int(in_fork(torch.cuda.device_count))
    uuids = [in_fork(lambda i=i: torch.cuda.get_device_properties(i).uuid) for i in range(count)]
    minors = [sandbox.nvidia_minor(u) for u in uuids]
    print(f"{count} GPUs; UUIDs {uuids}; their nodes' minors {minors}")
    for index, minor in enumerate(minors):

        def probe(minor=minor):
            sandbox.contain(sandbox.Policy(write=[SCRATCH], gpu=True, gpu_minors=[minor]))
            ran = []
            for device in range(count):
                try:
                    ran.append(f"cuda:{device} {float((torch.ones(4, device=f'cuda:{device}') * 2).sum()):g}")
                except BaseException as err:  # noqa: BLE001 - reported
                    ran.append(f"cuda:{device} {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            return f"counts {torch.cuda.device_count()}; " + "; ".join(ran)

        print(f"only /dev/nvidia{minor} (CUDA's {index}): {in_fork(probe)}", flush=True)


def main() -> int:
    if len(sandbox.nvidia_gpu_nodes()) > 1:
        one_gpu_of_several()
    for part in PARTS:

        def run_one(part=part) -> str:
            without(part)
            return f"ok ({float((torch.ones(1 << 20, device='cuda') * 2).sum()):g})"

        print(f"without {part:32s} {in_fork(run_one)}", flush=True)
    if shutil.which("strace"):
        traced = subprocess.run(
            [
                "strace",
                "-f",
                "-e",
                "trace=socket,connect",
                sys.executable,
                "-c",
                "import torch; torch.ones(1, device='cuda')",
            ],
            capture_output=True,
            text=True,
        )
        print("".join(line + "\n" for line in traced.stderr.splitlines() if "socket(" in line or "connect(" in line))
    else:
        print("strace: not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
