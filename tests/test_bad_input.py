"""Bad input to the CLI: one line naming the file, the field and what to do, exit 2, never a
traceback, and nothing evaluated or lost on the way. Only the exit code, output and files are
checked: the CLI runs in this process (`magpie_in_process`)."""

import json
import shutil

from conftest import FIXTURES, magpie_in_process, write

KERNEL = """
[[kernel]]
id = "relu2"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "good"
source = "good.py"

[[kernel.testcases]]
spec = "spec.py"
shapes = {shapes}
"""


def one_line_error(proc, exit_code: int = 2) -> str:
    """The single `magpie: ...` line a bad input must give, with no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == exit_code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magpie: "), proc.stderr
    return lines[0]


def fixture_files(root, *names: str) -> None:
    for name in names:
        shutil.copy(FIXTURES / "adversarial" / name, root / name)


def test_a_manifest_path_that_is_a_folder_or_missing_is_one_line(command_project):
    line = one_line_error(magpie_in_process("build", "-m", ".", cwd=command_project))
    assert "is a folder, not a file" in line and "magpie.toml" in line
    line = one_line_error(magpie_in_process("clean", "-m", "k1", cwd=command_project))
    assert line.startswith("magpie: k1: is a folder")
    line = one_line_error(magpie_in_process("build", "-m", "no_such.toml", cwd=command_project))
    assert line.startswith("magpie: no_such.toml: file not found")
    assert (command_project / "magpie.toml").is_file()  # the real manifest untouched


def test_a_manifest_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "magpie.toml").write_bytes(b'[project]\nname = "caf\xe9"\n')
    line = one_line_error(magpie_in_process("build", cwd=tmp_path))
    assert line == "magpie: magpie.toml:2: byte 0xe9 is not UTF-8: save the file as UTF-8"


def test_a_kernel_config_that_is_not_utf8_or_a_folder_is_one_line(tmp_path):
    (tmp_path / "k.yaml").write_bytes(b"kernel:\n  id: \xff\n")
    line = one_line_error(magpie_in_process("analyze", "--kernel-config", "k.yaml", cwd=tmp_path))
    assert line.startswith("magpie: k.yaml:2: byte 0xff is not UTF-8")
    line = one_line_error(magpie_in_process("analyze", "--kernel-config", ".", cwd=tmp_path))
    assert line == "magpie: .: is a folder, not a file: name the file itself"


def test_empty_and_negative_dimensions_are_refused_in_the_manifest(tmp_path):
    fixture_files(tmp_path, "good.py", "spec.py")
    for shapes, shown, bad in (("[[64, 32], [0, 1024]]", "[0, 1024]", 0), ("[[-1, 8]]", "[-1, 8]", -1)):
        write(tmp_path, {"magpie.toml": KERNEL.format(shapes=shapes)})
        line = one_line_error(magpie_in_process("build", cwd=tmp_path))
        assert line.startswith(
            f"magpie: magpie.toml: kernel[0].testcases[0].shapes: kernel 'relu2': "
            f"shape {shown} has a dimension of {bad}: every dimension must be at least 1"
        )
    assert not (tmp_path / "workspaces" / "store").exists()  # refused before anything ran


def test_empty_dimensions_are_refused_in_the_shapes_flag_and_kernel_configs(tmp_path):
    fixture_files(tmp_path, "good.py", "spec.py")
    for verb in ("analyze", "compare"):
        proc = magpie_in_process(
            verb,
            "good.py",
            "--type",
            "pytorch",
            "--entry",
            "kernel",
            "--spec",
            "spec.py",
            "--shapes",
            "16x32,0x1024",
            "-o",
            "out",
            cwd=tmp_path,
        )
        line = one_line_error(proc)
        assert line.startswith("magpie: --shapes: shape [0, 1024] has a dimension of 0")
    write(
        tmp_path,
        {
            "k.yaml": """
        kernels:
          - {id: a, type: pytorch, entry: kernel, source_files: [good.py], spec: spec.py, shapes: [[4, 0]]}
        """
        },
    )
    line = one_line_error(magpie_in_process("analyze", "--kernel-config", "k.yaml", "-o", "out", cwd=tmp_path))
    assert line.startswith("magpie: k.yaml: kernels[0].shapes: shape [4, 0] has a dimension of 0")
    assert not (tmp_path / "out").exists()


def test_renaming_the_project_rebuilds_the_report_only(command_project):
    magpie_in_process("build", cwd=command_project, check=0)
    manifest = command_project / "magpie.toml"
    manifest.write_text(manifest.read_text().replace('name = "cmd"', 'name = "renamed"'))
    plan = json.loads(magpie_in_process("build", "--dry-run", "--json", cwd=command_project, check=0).stdout)
    assert plan["would_run"] == [{"task": "report", "why": "project settings changed"}]
    built = json.loads(magpie_in_process("build", "--json", cwd=command_project, check=0).stdout)
    assert built["executed"] == ["report"]
    assert "renamed" in (command_project / "workspaces/reports/summary.md").read_text()


def test_yaml_errors_keep_their_line_and_column(tmp_path):
    (tmp_path / "k.yaml").write_text('kernel:\n  id: a\n  type: "pytor\\ch"\n')  # \c is no YAML escape
    line = one_line_error(magpie_in_process("analyze", "--kernel-config", "k.yaml", cwd=tmp_path))
    assert line == (
        "magpie: k.yaml:3:16: invalid YAML: found unknown escape character 'c' (while scanning a double-quoted scalar)"
    )


def test_analyze_without_entry_or_model_class_fails_before_evaluating(tmp_path):
    fixture_files(tmp_path, "good.py", "spec.py")
    for verb in ("analyze", "compare"):
        proc = magpie_in_process(
            verb, "good.py", "--type", "pytorch", "--spec", "spec.py", "--shapes", "16x32", "-o", "out", cwd=tmp_path
        )
        line = one_line_error(proc)
        assert line == (
            "magpie: good.py: no --entry given and no ModelNew or Model class in it: "
            "pass --entry NAME, the function to evaluate"
        )
        assert not (tmp_path / "out").exists()
    write(
        tmp_path,
        {"k.yaml": "kernel: {id: g, type: pytorch, source_files: [good.py], spec: spec.py, shapes: [[4, 8]]}\n"},
    )
    line = one_line_error(magpie_in_process("analyze", "--kernel-config", "k.yaml", "-o", "out", cwd=tmp_path))
    assert line == (
        "magpie: k.yaml: kernel 'g': no entry, and good.py has no ModelNew or Model class: "
        "add 'entry: NAME', the function to evaluate"
    )


def test_an_empty_manifest_says_it_declares_nothing(tmp_path):
    for text in ("", '[project]\nname = "nothing-yet"\n'):
        (tmp_path / "magpie.toml").write_text(text)
        line = one_line_error(magpie_in_process("build", cwd=tmp_path))
        assert line.startswith("magpie: magpie.toml: declares nothing to build: add a [[kernel]]")
    assert not (tmp_path / "workspaces").exists()
