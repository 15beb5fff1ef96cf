"""A worker's narrowing (`sandbox.narrow`, hermetic inputs) hides nothing of its own trees: its
scratch folder and compiler caches stay readable and keep working as Triton uses them, wherever
they lie (here, as in the H200 test that caught it, inside the project) and whatever they are
called now (an adopted spare's caches are renamed after its sandbox was entered). On fc5ac86's
second layer every Triton compile after the load failed: the layer refused moving a file from one
folder to another (Landlock's REFER, refused by any layer that does not grant it), which is how
Triton's cache stores each file it compiles; and a spare's caches renamed into its content's,
granted by their old path, went unreadable."""

import json
import subprocess
import sys

import pytest
from conftest import FIXTURES, build_json, relu2_report

from magpie import sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this host")

# In a child sandboxed with its scratch folder and a spare's caches inside the project (the
# parent renames the caches, as an adopting job does, once the child is in): after narrowing,
# what Triton's own cache does in each write tree, a declared file and an undeclared one.
NARROWED = """
import json, os, sys

from triton.runtime.cache import FileCacheManager

from magpie import sandbox

project, scratch, spare, adopted = sys.argv[1:5]
entered_r, entered_w = os.pipe()
renamed_r, renamed_w = os.pipe()
child = os.fork()
if child == 0:
    sandbox.contain(sandbox.Policy(write=[scratch, spare], read=[project], project=project), fork=False)
    os.write(entered_w, b"in")
    os.read(renamed_r, 1)
    sandbox.narrow([os.path.join(project, "declared.py")])
    seen = {}
    for name, tree in (("scratch", scratch), ("adopted", adopted)):
        os.environ["TRITON_CACHE_DIR"] = tree
        try:
            stored = FileCacheManager("kernel").put(b"compiled", "kernel.bin")
            with open(stored, "rb") as f:
                seen[name] = f.read().decode()
        except OSError as err:
            seen[name] = f"{type(err).__name__}: {err}"
    for name in ("declared.py", "undeclared.py"):
        try:
            with open(os.path.join(project, name)) as f:
                seen[name] = f.read()
        except OSError as err:
            seen[name] = type(err).__name__
    print(json.dumps(seen), flush=True)
    os._exit(0)
os.read(entered_r, 2)
os.makedirs(os.path.dirname(adopted), exist_ok=True)
os.rename(spare, adopted)
os.write(renamed_w, b"go")
os.waitpid(child, 0)
"""


def test_a_narrowed_sandbox_keeps_its_scratch_and_renamed_caches_inside_the_project_usable(tmp_path):
    project = tmp_path / "project"
    scratch, compiled = project / "tmp", project / "cache" / "magpie" / "compiled"
    spare, adopted = compiled / "spare-w", compiled / "worker-0" / "content"
    for folder in (scratch, spare):
        folder.mkdir(parents=True)
    (project / "declared.py").write_text("declared")
    (project / "undeclared.py").write_text("undeclared")
    proc = subprocess.run(
        [sys.executable, "-c", NARROWED, str(project), str(scratch), str(spare), str(adopted)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    seen = json.loads(proc.stdout)
    assert seen == {
        "scratch": "compiled",
        "adopted": "compiled",
        "declared.py": "declared",
        "undeclared.py": "PermissionError",
    }, seen
    assert (adopted / "kernel" / "kernel.bin").read_bytes() == b"compiled"


# A candidate that, as it is loaded, stores a file the way Triton's compile stores each it makes
# (into a folder of its own in the kernel's cache folder, then moved into it) and reads it back.
CACHING = """
from triton.runtime.cache import FileCacheManager

with open(FileCacheManager("relu2").put(b"compiled", "kernel.bin"), "rb") as stored:
    assert stored.read() == b"compiled"
"""


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """A candidate caching as Triton does, built, then edited and built again (loaded into the
    spare its first build started), with TMPDIR and the compiler caches inside the project:
    the first report and the edited build's correctness result."""
    root = tmp_path_factory.mktemp("cached")
    env = {"MAGPIE_KEEP_WARM_S": "20", "TMPDIR": str(root / "tmp"), "XDG_CACHE_HOME": str(root / "cache")}
    (root / "tmp").mkdir()
    good = (FIXTURES / "adversarial" / "good.py").read_text()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        first = relu2_report(root, ["cacher"], shapes="[[33, 65]]", sources={"cacher": good + CACHING})
        (root / "cacher.py").write_text(good + CACHING + "# edited\n")
        assert build_json(root, "-j", "2")["failed"] == []
    results = [json.loads(p.read_text()) for p in (root / "workspaces/store").glob("*/*/result.json")]
    edited = max(
        (r for r in results if r.get("task") == "correctness:relu2/cacher"), key=lambda r: r["task_started_unix"]
    )
    return first, edited


def test_a_candidate_that_caches_as_triton_does_is_judged_correct(cached):
    first, _ = cached
    row = next(r for r in first["results"] if r["implementation"] == "cacher")
    assert row["correctness_state"] == "SUCCESS", row.get("verdict")


def test_edited_and_loaded_into_a_spare_it_caches_in_the_renamed_caches(cached):
    _, edited = cached
    assert [load.get("spare") for load in edited["worker_loads_s"]] == [True], edited["worker_loads_s"]
    assert edited["correctness_state"] == "SUCCESS", edited.get("verdict")
