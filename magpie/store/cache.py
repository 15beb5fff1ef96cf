"""A cache of artifacts shared between machines (CI runners, a cluster, colleagues), beside the local store.

The local store stays where a build reads and writes; a remote cache is only a source of
artifacts it lacks and a place to put what it built. One interface (`Remote`: has, fetch, put,
by content key); one kind of remote so far, a folder (`SharedFolder`: a network mount, a folder
a CI cache action restores and saves). S3 and HTTP caches are not built.

The cache is not trusted: whoever can write it can put anything there. An artifact is taken
from it into a folder of the workspace (`cache-incoming/`, on the store's filesystem), checked
there by the store's own check (`Store.problem`: every file's size and sha256 against its
recorded digests, then the signature over the task, key and digests, by a trusted signer), and
only then renamed into the store; one that fails is removed and named in one line, and the
build runs its task as if the cache had none. Only plain files and folders are copied out of
the cache (a symlink or a device file there fails the artifact before anything is read through
it). Keys come from the project, never from the cache's folder names.

Writing is refused unless asked for (read-only by default) and unless this machine's signer is
one the project or user trusts (`[store] trusted_signers`, the `trusted-signers` file): what an
untrusted builder pushed would be rebuilt by every reader, so it is not pushed. A provisional
result (an inconclusive timing) is not pushed: it is measured again by the next build anyway.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from magpie.errors import UserError
from magpie.store import Store

INCOMING = "cache-incoming"  # in the workspace: artifacts fetched from a cache, checked before they enter the store
NOT_BUILT = ("s3://", "gs://", "http://", "https://")
HEX = frozenset("0123456789abcdef")


class Refused(Exception):
    """An entry of the cache that is not a plain file or folder."""


class Remote(Protocol):
    """Where a build's artifacts are shared: looked up, fetched and put by content key."""

    where: str
    writable: bool

    def has(self, key: str) -> bool: ...

    def exists(self) -> bool:
        """Whether there is a cache there at all (a CI cache's first run restores none)."""

    def fetch(self, key: str, into: Path) -> None:
        """The artifact's files copied into the folder `into` (made here); raises Refused."""

    def put(self, key: str, source: Path) -> bool:
        """The artifact folder `source` stored whole under key; False where the cache has it already."""


class SharedFolder:
    """A cache that is a folder: `store/<key[:2]>/<key>/`, the local store's layout. An artifact is
    written under a temporary name beside its place and renamed into it, so a reader sees it whole
    or not at all, and two writers of one key leave one."""

    def __init__(self, root: Path, writable: bool = False):
        self.root = root
        self.where = str(root)
        self.writable = writable

    def _path(self, key: str) -> Path:
        return self.root / "store" / key[:2] / key

    def has(self, key: str) -> bool:
        return self._path(key).is_dir()

    def exists(self) -> bool:
        return self.root.is_dir()

    def fetch(self, key: str, into: Path) -> None:
        _copy_plain(self._path(key), into)

    def put(self, key: str, source: Path) -> bool:
        final = self._path(key)
        if final.is_dir():
            return False
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=final.parent))
        try:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.is_dir():  # another writer stored it first
                return False
            raise
        return True


def _copy_plain(source: Path, target: Path) -> None:
    """Regular files and folders only, no link followed: the cache is written by others."""
    target.mkdir(parents=True)
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _copy_plain(Path(entry.path), target / entry.name)
            elif entry.is_file(follow_symlinks=False):
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as src, open(target / entry.name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                raise Refused(f"{entry.name} is not a plain file")


def open_cache(location: str, base: Path, *, writable: bool, source: str) -> SharedFolder:
    """The cache at `location` (a folder, relative to `base`; `file://` taken off). `source`: where
    the location was given, for the error line."""
    if location.startswith(NOT_BUILT):
        raise UserError(
            f"{source}: {location!r}: only a folder is supported as a cache (S3 and HTTP caches are not built); "
            f"give a folder, e.g. one your CI's cache action restores"
        )
    path = Path(os.path.expanduser(location.removeprefix("file://")))
    path = path if path.is_absolute() else base / path
    if path.exists() and not path.is_dir():
        raise UserError(f"{source}: {path} is not a folder: give the folder of the shared cache")
    return SharedFolder(path, writable)


def cache_warning(task: str, where: str, problem: str) -> str:
    """The one line of an artifact of the cache that is not used."""
    return f"cache: artifact of {task} in {where} not used ({problem}); building it here"


class Pulled:
    def __init__(self) -> None:
        self.taken: list[str] = []  # tasks whose artifact came from the cache
        self.rejected: list[tuple[str, str]] = []  # (task, why it was not used)


def pull(project, names: list[str], remote: Remote, warn: Callable[[str], None]) -> Pulled:
    """Into the local store, the artifacts of `names` (task names, with what they depend on) that
    it lacks and the cache has, each checked before it is used. In run order, each task's key
    resolved from the artifacts its dependencies have now: one taken lets its dependents' keys be
    known, and taken in turn."""
    store: Store = project.store
    pulled = Pulled()
    incoming = Store(store.workspace / INCOMING, trusted_signers=tuple(store.configured_signers))
    for name in wanted_in_run_order(project, names):
        key = project.resolve(name)
        if not key_known(key) or store.has(key) or not remote.has(key):
            continue
        folder = incoming.path(key)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            remote.fetch(key, folder)
            contents, stamp = incoming.scan(key)
            problem = incoming.problem(key, name, contents)
        except Refused as err:
            problem = str(err)
        except OSError as err:
            problem = f"unreadable: {err.strerror or err}"
        if problem is not None:
            shutil.rmtree(folder, ignore_errors=True)
            warn(cache_warning(name, remote.where, problem))
            pulled.rejected.append((name, problem))
            continue
        final = store.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(folder, final)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            if not final.is_dir():
                raise
            continue  # stored meanwhile (another build): checked where it is used
        # checked just now, files unmoved by the rename: trusted by their stat until they change
        store.stamps[key] = stamp
        store.digests[key] = incoming.expected(key) or {}
        store.record(name, key, project.tasks[name].parts)
        pulled.taken.append(name)
    shutil.rmtree(incoming.workspace, ignore_errors=True)
    return pulled


class Pushed:
    def __init__(self) -> None:
        self.put: list[str] = []
        self.present = 0  # in the cache already
        self.skipped: list[tuple[str, str]] = []  # (task, why it was not pushed)


def refuse_untrusted_writer(store: Store, remote: Remote) -> None:
    """Writing needs the cache opened for writing and this machine's signer trusted by the project
    or its user: others rebuild whatever an untrusted builder pushed."""
    from magpie.store import signing

    if not remote.writable:
        raise UserError(
            f"cache {remote.where}: read-only: give --cache-write (or [store] cache_write = true) on a "
            f"builder whose signing key is trusted"
        )
    signer = signing.public_key()
    if signer not in store.configured_signers | signing.user_trusted_signers():
        raise UserError(
            f"cache {remote.where}: this machine's signer {signer} is not in [store] trusted_signers of "
            f"magpie.toml (nor the user's trusted-signers file): readers would rebuild what it pushes; "
            f"add it there, or push from a trusted builder (in CI: MAGPIE_SIGNING_KEY from the secrets)"
        )


def push(project, names: list[str], remote: Remote, warn: Callable[[str], None]) -> Pushed:
    """Into the cache, the stored artifacts of `names` (with what they depend on) it lacks, each
    checked here first (a modified one is named and not pushed)."""
    store: Store = project.store
    refuse_untrusted_writer(store, remote)
    pushed = Pushed()
    for name in wanted_in_run_order(project, names):
        key = project.tasks[name].key
        if not key_known(key) or not store.has(key):
            continue
        if store.provisional(key) is not None:
            pushed.skipped.append((name, "provisional: measured again by the next build"))
            continue
        if remote.has(key):
            pushed.present += 1
            continue
        problem = store.check(key, name)
        if problem is not None:
            warn(f"cache: artifact of {name} not pushed: {problem} (magpie build rebuilds it)")
            pushed.skipped.append((name, problem))
            continue
        if remote.put(key, store.path(key)):
            pushed.put.append(name)
        else:
            pushed.present += 1
    return pushed


def key_known(key: str) -> bool:
    """A content key (64 hex digits); not one still waiting for a dependency's artifact (`unknown-...`)."""
    return len(key) == 64 and set(key) <= HEX


def wanted_in_run_order(project, names: list[str]) -> list[str]:
    """`names` and everything they depend on, in the project's run order (a task after its deps)."""
    wanted: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(project.tasks[name].deps)
    return [name for name in project.tasks if name in wanted]
