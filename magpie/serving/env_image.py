"""A Docker image of this machine's Python environment that runs `transformers serve`, built offline.

No registry is reachable from our machines, so the image docker mode is tested with (and the README's
docker example runs) is assembled here and `docker import`ed as one layer:

- the distributions `transformers serve` needs: `transformers[serving]`, `torch`, `tokenizers` and what
  their metadata says they require, each with the files its RECORD lists and the bytecode compiled since;
- the interpreter and its standard library (its `test` package left out); run from a virtual environment, also
  its `pyvenv.cfg`, without which the environment's `bin/python` in the image is the base interpreter and sees
  none of the environment's packages;
- `chown` (docker mode gives root-written outputs back to the invoking user with it);
- the shared libraries all of these link (`ldd`), the dynamic linker's cache, and a `/tmp` anyone may write.

Every file keeps the path it has on this machine: console scripts name the interpreter by its absolute
path, and the linker's cache names the libraries by theirs; `PATH` holds the environment's scripts folder
and its base interpreter's (a virtual environment made with `--system-site-packages` finds console scripts of
the base's distributions there). The tag is a content key: sha256 over the distributions' RECORDs (each lists
its files' sha256), the interpreter and `sys.prefix`, `pyvenv.cfg`, the libraries' sizes and modification times, and this
module's source; an unchanged environment finds its image and builds nothing, and a new image replaces the
older ones of the same environment (labelled with its `sys.prefix`), never another environment's.

    python -m magpie.serving.env_image            # prints the image's reference, building it if missing
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import threading
from importlib import metadata
from pathlib import Path

REPOSITORY = "magpie-serve-env"
ROOTS = (("transformers", {"serving"}), ("torch", set()), ("tokenizers", set()))
LEFT_OUT_STDLIB = ("site-packages", "test", "idlelib", "turtledemo", "tkinter", "ensurepip")
LDD_LIBRARY = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")
LINKER_CACHE = "/etc/ld.so.cache"
PREFIX_LABEL = "magpie.env_prefix"


class EnvImageError(RuntimeError):
    """The environment lacks what the image needs, or the daemon refused the import: one line."""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def search_path() -> list[str]:
    """The folders a fresh interpreter of this environment imports from, as the image's will. Not this process's
    `sys.path`: importing some packages extends it (Ray puts its own vendored psutil first), and a distribution
    found there is copied to a folder the image's Python never searches."""
    out = subprocess.run(
        [sys.executable, "-E", "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in json.loads(out) if p]  # '' is the folder `-c` ran in


def distributions(roots=ROOTS) -> list[metadata.Distribution]:
    """The installed distributions `roots` (name, extras) need, transitively, by their requirement markers,
    found where a fresh interpreter of this environment finds them."""
    from packaging.requirements import Requirement

    path = search_path()
    found: dict[str, tuple[metadata.Distribution, set[str]]] = {}
    todo = [(name, set(extras)) for name, extras in roots]
    while todo:
        name, extras = todo.pop()
        dist = next(iter(metadata.distributions(name=name, path=path)), None)
        if dist is None:
            if any(name == root for root, _ in roots):
                raise EnvImageError(f"{name} is not installed here: pip install -e '.[serve]'")
            continue  # an optional requirement whose marker held but which is not installed
        seen = found.get(_key(name))
        if seen is not None and extras <= seen[1]:
            continue
        extras |= seen[1] if seen else set()
        found[_key(name)] = (dist, extras)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append((req.name, set(req.extras)))
    return [dist for dist, _ in sorted(found.values(), key=lambda item: _key(item[0].metadata["Name"]))]


def _stdlib_files() -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = []
    for folder, dirs, names in os.walk(stdlib):
        if folder == stdlib:
            dirs[:] = [d for d in dirs if d not in LEFT_OUT_STDLIB]
        files += [os.path.join(folder, n) for n in names]
    return files


def _interpreter() -> list[str]:
    """The interpreter, the names it goes by in its bin folder (python3, python) and, in a virtual environment,
    the `pyvenv.cfg` that makes those names the environment's interpreter."""
    exe = os.path.realpath(sys.executable)
    folder = os.path.dirname(sys.executable)
    aliases = [os.path.join(folder, n) for n in ("python3", "python", os.path.basename(sys.executable))]
    return [exe] + [a for a in aliases if os.path.exists(a)] + _venv_config()


def _venv_config() -> list[str]:
    config = os.path.join(sys.prefix, "pyvenv.cfg")
    return [config] if sys.prefix != sys.base_prefix and os.path.isfile(config) else []


def script_folders() -> list[str]:
    """Where console scripts are installed: the environment's, then its base interpreter's."""
    folders = [sysconfig.get_path("scripts"), sysconfig.get_path("scripts", vars={"base": sys.base_prefix})]
    return list(dict.fromkeys(os.path.normpath(f) for f in folders))


def _linked(paths: list[str]) -> set[str]:
    """The shared libraries (and the dynamic linker) that the ELF files among `paths` load, transitively."""
    elf = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    elf.append(p)
        except OSError:
            continue
    libs: set[str] = set()
    for start in range(0, len(elf), 200):
        out = subprocess.run(["ldd", *elf[start : start + 200]], capture_output=True, text=True).stdout
        libs.update(os.path.normpath(m.group(1)) for m in LDD_LIBRARY.finditer(out))  # ldd keeps rpath's '..'
    return libs


def contents() -> tuple[list[str], str]:
    """(every file the image holds, by its path here; the content key)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{sys.version}\0{os.path.realpath(sys.executable)}\0{sys.prefix}\0".encode())
    for config in _venv_config():
        h.update(Path(config).read_bytes())
    files = set(_interpreter()) | set(_stdlib_files())
    for dist in distributions():
        h.update(dist.read_text("RECORD").encode() if dist.read_text("RECORD") else dist.metadata["Name"].encode())
        for rel in dist.files or []:
            path = os.path.normpath(str(dist.locate_file(rel)))
            if os.path.isfile(path):
                files.add(path)
            if path.endswith(".py"):  # compiled here after the install (not in RECORD): else every start compiles
                cached = importlib.util.cache_from_source(path)
                if os.path.isfile(cached):
                    files.add(cached)
    chown = shutil.which("chown")
    if chown is None:
        raise EnvImageError("no chown on PATH (coreutils): the image needs it")
    files.add(chown)
    libs = _linked(sorted(files))
    for lib in sorted(libs | {LINKER_CACHE}):
        st = os.stat(lib)
        h.update(f"{lib}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return sorted(files | libs | {LINKER_CACHE}), h.hexdigest()[:16]


def _write_tar(files: list[str], sink) -> None:
    """`files` (symlinks followed) as a tar stream, every folder above them 0755 (root's home is 0700 here), /tmp 1777."""
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        folders = {"tmp"} | {str(parent) for f in files for parent in Path(f.lstrip("/")).parents if str(parent) != "."}
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        for path in files:
            real = os.path.realpath(path)
            info = tar.gettarinfo(real, arcname=path.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(real, "rb") as f:
                tar.addfile(info, f)


def ensure(client=None) -> str:
    """The image's reference (`magpie-serve-env:<key>`), imported into the daemon unless it is there already."""
    import docker

    client = client or docker.from_env()
    files, key = contents()
    ref = f"{REPOSITORY}:{key}"
    try:
        client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    read_end, write_end = os.pipe()
    failure: list[BaseException] = []

    def feed():
        try:
            with open(write_end, "wb", buffering=1 << 20) as sink:
                _write_tar(files, sink)
        except BaseException as exc:  # the import below reports a broken stream; keep why
            failure.append(exc)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    path_var = os.pathsep.join(
        dict.fromkeys([os.path.dirname(sys.executable), *script_folders(), "/usr/local/bin", "/usr/bin", "/bin"])
    )
    try:
        with open(read_end, "rb") as source:
            client.api.import_image_from_stream(
                source,
                repository=REPOSITORY,
                tag=key,
                changes=[
                    f"ENV PATH={path_var}",
                    "ENV LANG=C.UTF-8",
                    f"LABEL magpie.env_image={key}",
                    f"LABEL {PREFIX_LABEL}={sys.prefix}",
                ],
            )
    except docker.errors.APIError as exc:
        raise EnvImageError(f"docker import of {ref} failed: {exc.explanation or exc}") from None
    finally:
        writer.join()
    if failure:
        raise EnvImageError(f"writing the image's files failed: {failure[0]}")
    client.images.get(ref)
    # this environment's earlier images (1.3 GB each); one without the label predates it and can match no key now
    for stale in client.images.list(REPOSITORY):
        if ref not in stale.tags and (stale.labels or {}).get(PREFIX_LABEL, sys.prefix) == sys.prefix:
            try:
                client.images.remove(stale.id)
            except docker.errors.APIError:
                pass  # a container still uses it
    return ref


def main(argv: list[str] | None = None) -> int:
    import argparse

    import docker

    argparse.ArgumentParser(prog="python -m magpie.serving.env_image", description=__doc__.split("\n\n")[0]).parse_args(
        argv
    )
    try:
        print(ensure())
    except (EnvImageError, docker.errors.DockerException) as exc:
        print(f"env_image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
