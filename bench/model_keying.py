"""Keying a declared benchmark on a multi-GB model folder: the first full load (every file hashed) against a later
one (digests remembered by stat, magpie/store/digests.py), each a fresh process running `Project.load`; beside
them, what the whole-file read the keys used before cost (sha256 of each file's bytes, read whole), and the
provenance's `model_hash` first and remembered.

Usage: python bench/model_keying.py [--gib 3] [--files 3] [--sparse] [--runs 3] [--keep]
The tree goes to a temporary folder under /tmp (removed unless --keep): real bytes written by default, or sparse
files (holes: no disk reads, so the figure is sha256 alone).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOAD = """
import sys, time
sys.path.insert(0, {repo!r})
t = time.perf_counter()
from magpie.project import Project
project = Project.load({manifest!r})
print(time.perf_counter() - t, project.store.file_digests.hashed_bytes)
"""
MODEL_HASH = """
import sys, time
sys.path.insert(0, {repo!r})
from magpie.serving.report import model_hash
from magpie.store.digests import FileDigests
t = time.perf_counter()
digests = FileDigests({cache!r})
model_hash({model!r}, digests)
print(time.perf_counter() - t, digests.hashed_bytes)
"""


def make_tree(model: Path, gib: float, files: int, sparse: bool) -> None:
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer.json").write_text("{}" + " " * 2_000_000)
    size = int(gib * (1 << 30) / files)
    block = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB of non-zero bytes
    for i in range(files):
        with open(model / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as handle:
            if sparse:
                handle.truncate(size)
            else:
                for _ in range(size // len(block)):
                    handle.write(block)
    time.sleep(2.5)  # older than the digests' settling time, as a model downloaded earlier is


def timed(script: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="magpie-model-keying-", dir="/tmp"))
    model = root / "model"
    make_tree(model, a.gib, a.files, a.sparse)
    manifest = root / "project" / "magpie.toml"
    manifest.parent.mkdir()
    manifest.write_text(
        f'[project]\nname = "keying"\n[[benchmark]]\nid = "big"\nengine = "transformers"\nmodel = "{model}"\n'
    )
    digests_file = manifest.parent / "workspaces" / "file-digests.json"
    load = LOAD.format(repo=str(REPO), manifest=str(manifest))
    firsts, cached = [], []
    for _ in range(a.runs):
        digests_file.unlink(missing_ok=True)
        firsts.append(timed(load))
        cached.append(timed(load))
    whole = []
    for _ in range(a.runs):
        t = time.perf_counter()
        for path in sorted(model.iterdir()):
            hashlib.sha256(path.read_bytes()).hexdigest()
        whole.append(time.perf_counter() - t)
    provenance = []
    for _ in range(a.runs):
        cache = root / f"user-digests-{len(provenance)}.json"
        script = MODEL_HASH.format(repo=str(REPO), cache=str(cache), model=str(model))
        provenance.append((timed(script), timed(script)))
    total = sum(p.stat().st_size for p in model.iterdir())
    print(
        f"{datetime.date.today()} {platform.node()} {platform.processor() or platform.machine()} "
        f"python {platform.python_version()}; {total / (1 << 30):.2f} GiB in {len(list(model.iterdir()))} files, "
        f"{'sparse' if a.sparse else 'real bytes (page cache warm)'}; {a.runs} runs, median (min-max) s"
    )

    def row(name, values):
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")

    print("| step | median s | min s | max s |\n|---|---:|---:|---:|")
    row("whole-file sha256 of every file (the keys' cost per full load before)", whole)
    row("Project.load, first key (every file hashed, streamed)", [t for t, _ in firsts])
    row("Project.load, digests remembered (nothing read)", [t for t, _ in cached])
    row("model_hash (provenance), first", [p[0][0] for p in provenance])
    row("model_hash (provenance), remembered", [p[1][0] for p in provenance])
    print(f"bytes hashed: first {firsts[0][1]:,}, remembered {cached[0][1]:,}")
    if not a.keep:
        import shutil

        shutil.rmtree(root)


if __name__ == "__main__":
    main()
