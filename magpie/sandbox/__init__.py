"""The sandbox every process that runs code under test starts in (workers, and the commands
of compile rules and command testcases).

`contain(policy)` turns the calling process, which must still be single-threaded (a fresh
fork), into the first process of new user, PID, mount and IPC namespaces (System V shared
memory, semaphores and queues go with it; CUDA IPC works across it) and, where no GPU is
needed, a network namespace of its own, which has nothing but a loopback that is down:

- every process it starts lives in that PID namespace and dies with it; it can name, signal
  or trace no process outside it (Landlock scopes signals and ptrace as well, and `/proc`
  shows only the namespace's processes);
- Landlock lets it write only its policy's `write` trees and read only the system's trees,
  the interpreter's and the policy's `read` trees: not the temporary folder (other jobs'
  scratch, magpie's locks and zygote sockets), nor the store unless it lies in the project,
  which is then read-only like everything else; no TCP unless the policy allows network; on
  a GPU, where CUDA needs /dev/shm, a /dev/shm of its own (empty, or the folder an evaluator
  links what it lends into), its own trees beneath the host's bound back;
- in a mount namespace of the code's own, every mount is read-only but its write trees:
  Landlock has no right for a file's metadata, so chmod, chown, utime and setxattr would
  otherwise work on every file it can see that its user owns (as root, every file);
- a seccomp filter makes the calls that reach into other processes or change the mount
  table fail, and without network, every socket (on a GPU, every one but a Unix socket,
  which CUDA needs); the folders where sockets live (`/run`, `/tmp`, homes) are covered;
  no_new_privs, no capabilities, and resource limits on memory, file size and processes.

It must work unprivileged and as root: root is root only in its own user namespace, and
Landlock holds whatever the file permissions say. The `describe()` of a policy is what a
report records as the isolation in force.

The rooms: `policy` (what a sandbox allows, `describe`), `devices` (the device nodes it may
open), `containment` (`contain`, `narrow`, the launcher's ways in), `init` (its PID namespace's
first process), `admission` (whether this host can sandbox, else trust), `keeper` (trusted
code's processes kept together), `landlock`, `seccomp`, `groups` (as root, a sandbox's cgroups: one
group on v2), `pids` (where they are made; a pids limit), `memory` (its memory account).
Below it lies only the Linux floor (`magpie.linux`); supervision, above, puts processes in it.
"""

from magpie.sandbox.admission import admit, trusted, unavailable_reason
from magpie.sandbox.containment import SandboxError, command, contain, enter_or_exit, narrow
from magpie.sandbox.devices import device_files, nvidia_gpu_nodes, nvidia_minor
from magpie.sandbox.init import SANDBOX_FAILED, SANDBOX_LIMIT, SANDBOX_MEMORY
from magpie.sandbox.policy import SHARED_MEMORY, Policy, default_memory_mb, describe, temporary_folders

__all__ = [
    "SANDBOX_FAILED",
    "SANDBOX_LIMIT",
    "SANDBOX_MEMORY",
    "SHARED_MEMORY",
    "Policy",
    "SandboxError",
    "admit",
    "command",
    "contain",
    "default_memory_mb",
    "describe",
    "device_files",
    "enter_or_exit",
    "narrow",
    "nvidia_gpu_nodes",
    "nvidia_minor",
    "temporary_folders",
    "trusted",
    "unavailable_reason",
]
