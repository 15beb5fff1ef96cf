"""CUDA and HIP implementations on a CPU machine: real compiles where the compiler exists,
clear lines where it does not, and no pretending to run what needs a GPU."""

import json
import shutil

import pytest
from conftest import REPO, build_json, write

from magpie.project import Project

MANIFEST = """
[project]
name = "native"
device = "{device}"

[[kernel]]
id = "softmax"
type = "{type}"
entry = "softmax"

[kernel.baseline]
id = "native"
source = "softmax.cu"

[[kernel.testcases]]
spec = "spec.py"
shapes = [[4, 8]]
"""


def _project(tmp_path, kernel_type="cuda", device="cpu"):
    shutil.copy(REPO / "examples/gpu/softmax/softmax.cu", tmp_path / "softmax.cu")
    shutil.copy(REPO / "examples/gpu/softmax/spec.py", tmp_path / "spec.py")
    write(tmp_path, {"magpie.toml": MANIFEST.format(type=kernel_type, device=device)})
    return tmp_path


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_compiles_here_and_is_not_run_on_a_cpu_device(tmp_path):
    root = _project(tmp_path)
    build_json(root)
    report = json.loads((root / "workspaces/reports/softmax/compare_report.json").read_text())
    row = report["results"][0]
    assert row["compiling_state"] == "SUCCESS"
    assert row["correctness_state"] == "SKIPPED" and "GPU device only" in row["verdict"]
    assert list((root / "workspaces/store").glob("*/*/native.so"))


def test_missing_hipcc_is_one_clear_line(tmp_path, monkeypatch):
    if shutil.which("hipcc"):
        pytest.skip("hipcc is installed here")
    root = _project(tmp_path, kernel_type="hip")
    build_json(root)
    row = json.loads((root / "workspaces/reports/softmax/compare_report.json").read_text())["results"][0]
    assert row["compiling_state"] == "FAILED"
    assert row["errors"][0].startswith(
        "hipcc not found: install ROCm or override the action of rule 'compile' for hip kernels"
    )


def test_profile_rule_applies_only_on_gpu_devices(tmp_path):
    cpu = Project.load(_project(tmp_path) / "magpie.toml")
    assert not [t for t in cpu.tasks if t.startswith("profile:")]
    gpu = Project.load(_project(tmp_path, device="cuda") / "magpie.toml")
    assert "profile:softmax/native" in gpu.tasks
    assert "profile:softmax/native" in gpu.tasks["comparison:softmax"].deps
    compile_action = gpu.tasks["compile:softmax/native"].config["compile"]
    assert compile_action["arch"].startswith("sm_")


def test_bad_device_and_arch_are_one_line(tmp_path):
    from magpie.errors import UserError

    root = _project(tmp_path, device="tpu")
    with pytest.raises(UserError, match=r"project.device"):
        Project.load(root / "magpie.toml")
