"""Manifest and kernel-config validation: every mistake is one line naming file, field and fix."""

import pytest
from conftest import FIXTURES, REPO, magpie_in_process, write

from magpie.errors import UserError
from magpie.manifest.kernel_config import load_kernel_config
from magpie.manifest.load import load_manifest

BASE = """
[[kernel]]
id = "k"
type = "triton"
entry = "f"

[kernel.baseline]
id = "ref"
type = "pytorch"
source = "ref.py"

[[kernel.candidates]]
id = "v1"
source = "v1.py"
"""


def load(tmp_path, text, files=("ref.py", "v1.py")):
    write(tmp_path, {"magpie.toml": text, **{f: "def f(x):\n    return x\n" for f in files}})
    return load_manifest(tmp_path / "magpie.toml")


def error_of(tmp_path, text, files=("ref.py", "v1.py")) -> str:
    with pytest.raises(UserError) as info:
        load(tmp_path, text, files)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_example_project_loads():
    manifest, root = load_manifest(REPO / "magpie.toml")
    kernel = manifest.kernel[0]
    assert kernel.baseline.id == "torch"
    assert [c.id for c in kernel.candidates] == ["triton_rowwise", "triton_pad_zero", "torch_naive"]
    assert kernel.impl_type(kernel.candidates[2]) == "pytorch"
    assert kernel.impl_type(kernel.candidates[0]) == "triton"


def test_missing_source_names_the_field_path(tmp_path):
    text = BASE.replace('id = "k"', 'id = "k0"') + BASE.replace("v1.py", "kernels/v2.py")
    text = text.replace('[[kernel]]\nid = "k"\n', '[[kernel]]\nid = "k1"\n', 1)
    message = error_of(tmp_path, text)
    assert message.endswith("magpie.toml: kernel[1].candidates[0].source: file not found: kernels/v2.py")


def test_unknown_field_is_named(tmp_path):
    message = error_of(tmp_path, BASE.replace('source = "v1.py"', 'sourc = "v1.py"'))
    assert "kernel[0].candidates[0]" in message and "sourc" in message


def test_testcase_needs_exactly_one_kind(tmp_path):
    text = BASE + '\n[[kernel.testcases]]\ncommand = "true"\nspec = "ref.py"\nshapes = [[4]]\n'
    message = error_of(tmp_path, text)
    assert "kernel[0].testcases[0]" in message and "exactly one" in message


def test_spec_needs_shapes_unless_kernelbench(tmp_path):
    message = error_of(tmp_path, BASE + '\n[[kernel.testcases]]\nspec = "ref.py"\n')
    assert "kernel[0].testcases[0].shapes" in message


def test_unknown_dtype_and_kernel_type(tmp_path):
    message = error_of(tmp_path, BASE + '\n[[kernel.testcases]]\nspec = "ref.py"\nshapes=[[2]]\ndtypes=["f32"]\n')
    assert "dtypes" in message and "unknown dtype 'f32'" in message
    message = error_of(tmp_path, BASE.replace('type = "triton"', 'type = "opencl"'))
    assert "kernel[0].type" in message


def test_duplicate_implementation_ids(tmp_path):
    message = error_of(tmp_path, BASE.replace('id = "v1"', 'id = "ref"'))
    assert "used twice" in message


def test_invalid_toml_is_one_line(tmp_path):
    message = error_of(tmp_path, "[[kernel]\nid=")
    assert "invalid TOML" in message


def test_cli_reports_manifest_error_without_traceback(tmp_path):
    write(tmp_path, {"magpie.toml": BASE, "ref.py": "x = 1\n"})
    proc = magpie_in_process("build", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "magpie: magpie.toml: kernel[0].candidates[0].source: file not found: v1.py"
    ]
    assert "Traceback" not in proc.stderr


def test_project_rule_overrides_and_bad_rule(tmp_path):
    from magpie.project import Project

    rule = 'action = "nvcc -arch=sm_90 -o {out}/k.so {impl.source}"'
    text = BASE + f'\n[[rule]]\nname = "compile"\ntypes = ["cuda"]\n{rule}\n'
    write(tmp_path, {"magpie.toml": text, "ref.py": "", "v1.py": ""})
    project = Project.load(tmp_path / "magpie.toml")
    from magpie.graph.rules import resolve_rules

    rules = resolve_rules(project.manifest.rule, tmp_path / "magpie.toml")
    cuda = [r for r in rules if r.name == "compile" and "cuda" in r.types]
    assert cuda[0].action.startswith("nvcc -arch=sm_90") and cuda[0].version == 1
    write(tmp_path, {"magpie.toml": BASE + '\n[[rule]]\nname = "lint"\naction = "true"\ndeps = ["nothing"]\n'})
    with pytest.raises(UserError, match=r"rule 'lint'.deps: no rule named 'nothing'"):
        Project.load(tmp_path / "magpie.toml")
    write(tmp_path, {"magpie.toml": BASE + '\n[[rule]]\nname = "lint"\naction = "true"\nscope = "galaxy"\n'})
    with pytest.raises(UserError, match=r"magpie.toml: rule\[0\].scope"):
        Project.load(tmp_path / "magpie.toml")


def test_yaml_kernel_config(tmp_path):
    write(
        tmp_path,
        {
            "one.yaml": """
            kernel:
              id: relu
              type: pytorch
              source_files: [good.py]
              working_dir: .
              env: {OMP_NUM_THREADS: 1}
              testcase_command: "python -c 'pass'"
            """,
            "many.yaml": """
            kernels:
              - {id: a, type: pytorch, source_files: [good.py]}
              - {id: b, type: pytorch, source_files: [missing.py]}
            """,
            "good.py": "def kernel(x):\n    return x\n",
        },
    )
    kernels, root = load_kernel_config(tmp_path / "one.yaml")
    assert kernels[0].impl.id == "relu" and kernels[0].impl.env == {"OMP_NUM_THREADS": "1"}
    assert kernels[0].testcases[0].command == "python -c 'pass'"
    with pytest.raises(UserError, match=r"many.yaml: kernels\[1\].source_files\[0\]: file not found: missing.py"):
        load_kernel_config(tmp_path / "many.yaml")


def test_kernelbench_spec_needs_no_shapes(tmp_path):
    text = BASE + '\n[[kernel.testcases]]\nspec = "kb.py"\n'
    write(
        tmp_path,
        {
            "magpie.toml": text,
            "ref.py": "",
            "v1.py": "",
            "kb.py": (FIXTURES / "kernelbench" / "reference.py").read_text(),
        },
    )
    manifest, _ = load_manifest(tmp_path / "magpie.toml")
    assert manifest.kernel[0].testcases[0].spec == "kb.py"
