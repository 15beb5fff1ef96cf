"""Code under test reads, of the project, only the files its implementation declares. On 872a590
a candidate that imported a helper module beside it, undeclared, was judged correct, and after
the helper changed the build said "up to date" and kept the verdict; a candidate could read its
competitors' sources. Now the undeclared import fails with one line naming the file and the
field to add it to, a declared helper works, and a competitor's source cannot be read."""

import json

import pytest
from conftest import QUICK_TIMING, build_json, copy_fixtures, kernel_table, magpie, project_toml, relu2_project

from magpie import sandbox

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="no sandbox on this host")

HELPER = "def twice(x):\n    return x * 2.0\n"
USES_HELPER = "import torch\nfrom helper import twice\n\n\ndef kernel(x):\n    return twice(torch.relu(x))\n"
SNOOP = """
import os

import torch

for name in ("rival.py", "spec.py", "magpie.toml"):
    try:
        with open(os.path.join({root!r}, name)) as f:
            f.read()
        print("SUCCEEDED read", name, flush=True)
    except OSError as err:
        print("failed read", name, type(err).__name__, flush=True)
print("listed", sorted(os.listdir({root!r}))[:3], flush=True)


def kernel(x):
    return torch.relu(x) * 2.0
"""


@pytest.fixture(scope="module")
def hermetic(tmp_path_factory):
    return hermetic_build(tmp_path_factory.mktemp("hermetic"), "cpu")


def hermetic_build(root, device: str):
    """A candidate importing a helper undeclared, one declaring it, a snoop and a rival, built on
    device: the project, the build's JSON and the report's rows by implementation."""
    (root / "kernels").mkdir()
    (root / "kernels" / "helper.py").write_text(HELPER)
    (root / "kernels" / "undeclared.py").write_text(USES_HELPER)
    (root / "kernels" / "declared.py").write_text(USES_HELPER)
    (root / "rival.py").write_text("import torch\n\n\ndef kernel(x):\n    return torch.relu(x) * 2.0\n")
    (root / "snoop.py").write_text(SNOOP.format(root=str(root)))
    copy_fixtures(root, ["good", "spec"])
    relu2 = kernel_table(
        "relu2",
        "good",
        ["rival", "snoop", "undeclared", "declared"],
        shapes="[[33, 65]]",
        sources={"undeclared": "kernels/undeclared.py", "declared": "kernels/declared.py"},
        candidate_settings={"declared": 'source_files = ["kernels/helper.py"]'},
    )
    (root / "magpie.toml").write_text(
        project_toml(relu2, device=device, defaults="timeout_s = 60", timing=QUICK_TIMING)
    )
    result = build_json(root, "-j", "1")
    report = json.loads((root / "workspaces/reports/relu2/compare_report.json").read_text())
    return root, result, {r["implementation"]: r for r in report["results"]}


def test_an_undeclared_import_fails_in_one_line_naming_the_file_and_the_field(hermetic):
    _, result, rows = hermetic
    assert result["failed"] == []
    row = rows["undeclared"]
    assert row["correctness_state"] == "FAILED"
    assert row["verdict"] == (
        "error while loading: candidate undeclared read kernels/helper.py, which is not "
        "declared: add it to source_files of implementation undeclared in magpie.toml"
    )


def test_a_declared_helper_is_imported_and_judged(hermetic):
    _, _, rows = hermetic
    assert rows["declared"]["correctness_state"] == "SUCCESS"
    assert rows["rival"]["correctness_state"] == "SUCCESS"


def test_a_candidate_cannot_read_its_competitors_source_the_spec_or_the_manifest(hermetic):
    root, _, rows = hermetic
    assert rows["snoop"]["correctness_state"] == "SUCCESS"
    logs = list((root / "workspaces/store").glob("*/*/worker-snoop.log"))
    lines = {line for log in logs for line in log.read_text().splitlines()}
    for name in ("rival.py", "spec.py", "magpie.toml"):
        assert f"failed read {name} PermissionError" in lines, sorted(lines)
    assert not any(line.startswith("SUCCEEDED") for line in lines)


@pytest.mark.gpu
def test_hermetic_inputs_hold_for_gpu_workers(tmp_path):
    """With CUDA in the worker: the undeclared import is the same one line, the declared helper
    works, the snoop reads nothing of its competitors."""
    root, result, rows = hermetic_build(tmp_path, "cuda")
    assert result["failed"] == []
    assert rows["undeclared"]["verdict"].startswith("error while loading: candidate undeclared read kernels/helper.py")
    assert {rows[n]["correctness_state"] for n in ("declared", "rival", "snoop")} == {"SUCCESS"}
    logs = list((root / "workspaces/store").glob("*/*/worker-snoop.log"))
    assert not any(line.startswith("SUCCEEDED") for log in logs for line in log.read_text().splitlines())


SPEC_WITH_HELPER = """
import torch
from common import doubled


def make_inputs(shape, dtype, generator):
    return (torch.randn(shape, generator=generator, dtype=torch.float32),)


def reference(x):
    return doubled(torch.relu(x))
"""


def test_a_spec_imports_only_what_its_testcase_declares(tmp_path):
    """The spec runs in the (trusted) evaluator, outside any sandbox: a module of the project it
    imports undeclared is refused in one line; declared in `spec_files`, it keys the testcase's
    tasks and is used."""
    for kernel in ("undeclared", "declared"):
        (tmp_path / kernel).mkdir()
        (tmp_path / kernel / "common.py").write_text("def doubled(x):\n    return x * 2.0\n")
        (tmp_path / kernel / "spec.py").write_text(SPEC_WITH_HELPER)
        (tmp_path / kernel / "good.py").write_text("import torch\n\n\ndef kernel(x):\n    return torch.relu(x) * 2.0\n")
    tables = [
        kernel_table(
            kernel, "good", folder=f"{kernel}/", spec=f"{kernel}/spec.py", shapes="[[8, 16]]", testcase=declared
        )
        for kernel, declared in (("undeclared", ""), ("declared", 'spec_files = ["declared/common.py"]'))
    ]
    (tmp_path / "magpie.toml").write_text(
        project_toml(*tables, name="specs", timing="warmup_ms = 5\nbudget_ms = 30\nrounds = 2")
    )
    build_json(tmp_path, "-j", "1")
    rows = {}
    for kernel in ("undeclared", "declared"):
        report = json.loads((tmp_path / f"workspaces/reports/{kernel}/compare_report.json").read_text())
        rows[kernel] = next(r for r in report["results"] if r["implementation"] == "good")
    assert rows["declared"]["correctness_state"] == "SUCCESS"
    assert rows["undeclared"]["correctness_state"] != "SUCCESS"
    assert (
        "spec undeclared/spec.py imported undeclared/common.py, which is not declared: add it to spec_files "
        "of testcase 0 of kernel undeclared in magpie.toml"
    ) in rows["undeclared"]["verdict"]


@pytest.mark.parametrize("declared", ["../outside.py", "absent.py"])
def test_a_spec_file_outside_the_project_or_missing_stops_the_build_in_one_line(tmp_path, declared):
    """What `spec_files` names is read into the store's snapshots: it must be a file of the
    project (a path out of it, as for every other path of magpie.toml), else one line, exit 2."""
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "outside.py").write_text("SECRET = 1\n")
    relu2_project(project, [], shapes="[[8, 16]]")
    manifest = (
        (project / "magpie.toml")
        .read_text()
        .replace('spec = "spec.py"', f'spec = "spec.py"\nspec_files = ["{declared}"]')
    )
    (project / "magpie.toml").write_text(manifest)
    proc = magpie("build", cwd=project, check=2)
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("magpie: magpie.toml: kernel relu2: testcases[0].spec_files[0]"), line
    assert ("resolves outside the project" if declared.startswith("..") else "file not found") in line
    snapshots = project / "workspaces" / "snapshots"
    assert not snapshots.exists() or not any(b"SECRET" in p.read_bytes() for p in snapshots.rglob("*") if p.is_file())
