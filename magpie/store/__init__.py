"""Content-addressed artifact store under the workspace.

An artifact is a folder `store/<key[:2]>/<key>/` holding `result.json` and any files the
action produced. It is built in a temporary folder beside it and renamed into place, so
an artifact either exists whole or not at all; a killed build leaves only temp folders,
which the next build removes. The store is plain files: copy it and the cache travels.

Every artifact's files are recorded when it is committed (size and sha256 of each) in its
index record, outside the artifact folder, and in `.digest.json` inside it (for a store
copied without its index, and for artifacts of earlier keys, whose index record was
replaced). Reading an artifact for a dependent or for publishing checks them: an artifact
whose files differ (modified, truncated, missing, added) or that has no recorded digest
(written by an older magpie) is not trusted, and the build removes and rebuilds it. The
stat of every file when its digest was last found right (`stamps`) lets a no-op build
trust an untouched artifact without reading it (a file added to the folder, or a changed
.digest.json, is found when the artifact is next read, or by `magpie verify`).

Digests alone prove nothing to a reader who did not record them: whoever can rewrite a file
of the store (a CI cache) can rewrite its digests with it. So every artifact is also signed
(`.signature.json`, `signing.py`) over its task, key and files' digests, with a key kept
outside the store, and is used only when that signature holds and its signer is trusted:
this machine's key, or one configured (`[store] trusted_signers` in magpie.toml, the user's
`trusted-signers` file). An artifact signed by anyone else is treated as absent (rebuilt,
so re-judged and re-measured here); one unsigned, or whose signature fails, is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

RESULT = "result.json"
DIGEST = ".digest.json"  # inside the artifact: its task, key and every other file's [size, sha256]
SIGNATURE = ".signature.json"  # inside the artifact: signer, signature and MAC of its task, key and digests
UNRECORDED = "no digest recorded"
UNSIGNED = "not signed"
BAD_SIGNATURE = "signature does not match its task, key and files"
UNTRUSTED = "signed by {signer}, not a trusted signer"
# inside the artifact of a result that is not final (its `provisional` field: why): the next
# build runs its task again; a file, so that finding it is one open, not a read of result.json
PROVISIONAL = ".provisional"
RESERVED = (DIGEST, SIGNATURE, PROVISIONAL)  # the store's own files in an artifact: never an action's


class Modified(Exception):
    """An artifact whose files are not the ones recorded when it was committed."""

    def __init__(self, task: str, problem: str):
        super().__init__(warning(task, problem))
        self.task, self.problem = task, problem


def warning(task: str, problem: str) -> str:
    """The one line a build prints before rebuilding an artifact it does not trust."""
    if problem == UNRECORDED:
        return f"store: artifact of {task} has no recorded digest (written by an older magpie); rebuilding it"
    if problem == UNSIGNED:
        return (
            f"store: artifact of {task} is not signed (written by an older magpie, or its signature removed); "
            f"rebuilding it"
        )
    if problem.startswith("signed by "):
        return (
            f"store: artifact of {task} is {problem} (magpie key prints a machine's signer; trust one with "
            f"[store] trusted_signers in magpie.toml); rebuilding it"
        )
    return f"store: artifact of {task} was modified after it was written ({problem}); rebuilding it"


def reason(problem: str) -> str:
    """Why a build runs a task again whose artifact it does not trust (as `--dry-run` says it)."""
    if problem in (UNRECORDED, UNSIGNED) or problem.startswith("signed by "):
        return problem
    return f"modified after it was written: {problem}"


def _file_stamp(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _well_formed(files) -> bool:
    return (
        isinstance(files, dict)
        and RESULT in files
        and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str)
            for v in files.values()
        )
    )


def _digest(data: bytes) -> list:
    return [len(data), hashlib.sha256(data).hexdigest()]


class Store:
    def __init__(self, workspace: Path, trusted_signers: tuple[str, ...] = ()):
        from magpie.store import signing

        signing.take_secret_from_environment()  # where no CLI took it (dodo.py): before any process starts
        self.workspace = Path(workspace)
        self.configured_signers = frozenset(trusted_signers)  # the project's; this machine's and the user's added
        self._trusted: frozenset[str] | None = None
        self.objects = self.workspace / "store"
        self.snapshots = self.workspace / "snapshots"  # input files' bytes by digest, as their tasks were keyed
        self.index = self.workspace / "index"
        # key -> [[file, inode, size, mtime_ns, ctime_ns], ...] of its files (.digest.json aside)
        # when their digests were last found right: a stat that still matches needs no hashing
        self.stamps: dict[str, list] = {}
        self.digests: dict[str, dict] = {}  # key -> {file: [size, sha256]} of what this process committed
        self.file_digests_path = self.workspace / "file-digests.json"
        self._file_digests = None

    @property
    def file_digests(self):
        """Large input files' digests remembered by stat (`digests.py`), read when first needed."""
        if self._file_digests is None:
            from magpie.store.digests import FileDigests

            self._file_digests = FileDigests(self.file_digests_path)
        return self._file_digests

    def path(self, key: str) -> Path:
        return self.objects / key[:2] / key

    def has(self, key: str) -> bool:
        return os.path.isdir(f"{self.objects}/{key[:2]}/{key}")

    def read(self, key: str) -> dict:
        return json.loads((self.path(key) / RESULT).read_text())

    def commit(self, key: str, result: dict, files: dict[str, bytes], task: str | None = None) -> Path:
        from magpie.store import signing

        for reserved in RESERVED:
            if reserved in files:
                raise ValueError(
                    f"an action may not produce a file named {reserved} (the store's record of the artifact)"
                )
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=final.parent))
        contents = {**files, RESULT: json.dumps(result, indent=1, sort_keys=True).encode()}
        if result.get("provisional"):  # among the digests, so signed: a marker removed is a modified artifact
            contents[PROVISIONAL] = str(result["provisional"]).encode()
        digests = {name: _digest(data) for name, data in sorted(contents.items())}
        try:
            for name, data in contents.items():
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (tmp / DIGEST).write_text(json.dumps({"task": task, "key": key, "files": digests}, sort_keys=True))
            kept_digests: dict | None = digests
            signature = signing.sign(signing.artifact_message(task, key, digests))
            (tmp / SIGNATURE).write_text(json.dumps(signature, sort_keys=True))
            # stat before the rename (which leaves files' stat alone): a later write shows
            stamp: list | None = [[name, *_file_stamp(str(tmp / name))] for name in sorted([*contents, SIGNATURE])]
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # lost a race to an identical artifact otherwise
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                kept_digests, stamp = self._expected_in_folder(key), None  # the winner's files, checked on use
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if kept_digests is not None:
            self.digests[key] = kept_digests
        if stamp is not None:
            self.stamps[key] = stamp
        return final

    def provisional(self, key: str) -> str | None:
        """Why the artifact's result is not final (the next build runs its task again); None when
        it is. Trusted as far as the artifact is: a build checks it first (`check`)."""
        try:
            with open(f"{self.objects}/{key[:2]}/{key}/{PROVISIONAL}", "rb") as handle:
                return handle.read().decode(errors="replace")
        except OSError:
            return None

    # Integrity: what was recorded at commit against what the folder holds now.
    def expected(self, key: str, task: str | None = None) -> dict | None:
        """{file: [size, sha256]} recorded for the artifact: its index record's when that is for
        this key (outside the folder), else the folder's own .digest.json; None if neither."""
        record = self.recorded(task) if task else None
        if record and record.get("key") == key and _well_formed(record.get("files")):
            return record["files"]
        return self._expected_in_folder(key)

    def _expected_in_folder(self, key: str) -> dict | None:
        try:
            data = json.loads((self.path(key) / DIGEST).read_text())
        except (OSError, ValueError):
            return None
        files = data.get("files") if isinstance(data, dict) and data.get("key") == key else None
        return files if _well_formed(files) else None

    def scan(self, key: str) -> tuple[dict[str, bytes], list]:
        """Every file of the artifact (the store's own aside) as bytes, and their stat taken before
        reading (the signature's among them: a stamp holds only while the signature is the one checked)."""
        contents: dict[str, bytes] = {}
        stamp: list = []

        def walk(folder: str, prefix: str) -> None:
            try:
                entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
            except OSError:
                return
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, rel + "/")
                    continue
                if rel == DIGEST:
                    continue
                if rel == SIGNATURE:
                    try:
                        st = os.stat(entry.path)
                    except OSError:
                        continue
                    stamp.append([rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
                    continue
                try:
                    with open(entry.path, "rb") as handle:
                        st = os.fstat(handle.fileno())
                        contents[rel] = handle.read()
                except OSError:
                    continue  # vanished while read: reported missing if it was recorded
                stamp.append([rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])

        walk(f"{self.objects}/{key[:2]}/{key}", "")
        return contents, stamp

    def problem(self, key: str, task: str | None = None, contents: dict[str, bytes] | None = None) -> str | None:
        """What is wrong with the artifact (None when its files are the ones recorded)."""
        if not contents and not self.has(key):
            return "artifact folder missing"
        expected = self.expected(key, task)
        if expected is None:
            return UNRECORDED
        if contents is None:
            contents = self.scan(key)[0]
        for name, (size, sha) in sorted(expected.items()):
            data = contents.get(name)
            if data is None:
                return f"{name} missing"
            if len(data) < size:
                return f"{name} truncated"
            if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
                return f"{name} digest mismatch"
        extra = sorted(set(contents) - set(expected))
        if extra:
            return f"unexpected file {extra[0]}"
        return self.signature_problem(key, task, expected)

    def signature_problem(self, key: str, task: str | None, files: dict) -> str | None:
        """None when the artifact's signature covers this task, key and these files' digests (the
        ones just found in its folder) and its signer is trusted. What this machine's secret
        signed is known by its MAC, without loading `cryptography`."""
        from magpie.store import signing

        try:
            with open(f"{self.objects}/{key[:2]}/{key}/{SIGNATURE}", "rb") as handle:
                signed = json.loads(handle.read())
        except FileNotFoundError:
            return UNSIGNED
        except (OSError, ValueError):
            return BAD_SIGNATURE
        if not isinstance(signed, dict):
            return BAD_SIGNATURE
        message = signing.artifact_message(task, key, files)
        signer, signature = signed.get("signer"), signed.get("signature")
        if (
            isinstance(signer, str)
            and isinstance(signature, str)
            and signing.mac_matches(signing.artifact_mac(message, signer, signature), signed.get("mac"))
        ):
            return None
        if not signing.signature_valid(signer, signature, message):
            return BAD_SIGNATURE
        if signer not in self.trusted_signers():
            return UNTRUSTED.format(signer=signer)
        return None

    def trusted_signers(self) -> frozenset[str]:
        """This machine's signer, the project's and the user's trusted ones."""
        if self._trusted is None:
            from magpie.store import signing

            self._trusted = frozenset({signing.public_key(), *self.configured_signers, *signing.user_trusted_signers()})
        return self._trusted

    def unchanged(self, key: str, stamp: list | None) -> bool:
        """Whether every file still has the stat it had when its digest was found right (no reading)."""
        if not stamp:
            return False
        base = f"{self.objects}/{key[:2]}/{key}/"
        try:
            for name, *stat in stamp:
                if _file_stamp(base + name) != stat:
                    return False
        except (OSError, TypeError, ValueError):
            return False
        return True

    def verified_files(self, key: str, task: str) -> dict[str, bytes]:
        """The artifact's files, checked against its recorded digests; raises Modified."""
        contents, stamp = self.scan(key)
        problem = self.problem(key, task, contents)
        if problem is not None:
            raise Modified(task, problem)
        self.stamps[key] = stamp
        return contents

    def read_verified(self, key: str, task: str) -> dict:
        return json.loads(self.verified_files(key, task)[RESULT])

    def check(self, key: str, task: str, *, trust_stamps: bool = True) -> str | None:
        """None when the artifact is intact: its stat unchanged since its digest was last found
        right (when trust_stamps), or its files hashed and found to be the ones recorded."""
        if trust_stamps and self.unchanged(key, self.stamps.get(key)):
            return None
        try:
            self.verified_files(key, task)
        except Modified as err:
            return err.problem
        return None

    def remove(self, key: str) -> bool:
        self.stamps.pop(key, None)
        path = self.path(key)
        if path.is_dir():
            shutil.rmtree(path)
            return True
        return False

    def sweep_temporaries(self) -> int:
        """Remove what a killed build left half-written."""
        count = 0
        if self.objects.is_dir():
            for tmp in self.objects.glob("*/.tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
                count += 1
        return count

    # The index remembers, per task name, the key and the parts of the key of its last
    # build: `--dry-run` uses it to say why a task would run, reports to find artifacts.
    def _index_file(self, task_name: str) -> Path:
        return self.index / (quote(task_name, safe="") + ".json")

    def record(self, task_name: str, key: str, parts: dict) -> None:
        """Also the digests of the artifact this process committed for the key (checked on use)."""
        self.index.mkdir(parents=True, exist_ok=True)
        data = {"key": key, "parts": parts}
        if key in self.digests:
            data["files"] = self.digests[key]
        atomic_write(self._index_file(task_name), json.dumps(data, sort_keys=True))

    def recorded(self, task_name: str) -> dict | None:
        try:
            with open(f"{self.index}/{quote(task_name, safe='')}.json", "rb") as handle:
                return json.loads(handle.read())
        except (OSError, ValueError):
            return None

    def forget(self, task_name: str) -> None:
        try:
            self._index_file(task_name).unlink()
        except FileNotFoundError:
            pass


def atomic_write(path: Path, text: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)  # a refused write() names no file: say which was being written
        raise
