"""Every path a manifest or kernel config names resolves, symlinks followed, inside the project
(issue 38.5): otherwise one line naming the file and field, exit 2, and nothing from outside
is read into the store or copied into workspaces/snapshots/, which a CI cache uploads."""

import os
from pathlib import Path

import pytest
from conftest import COMMAND_PROJECT, FIXTURES, build_json, magpie, write

from magpie.errors import UserError
from magpie.manifest.kernel_config import load_kernel_config
from magpie.manifest.load import load_manifest

SECRET = "host-secret: never in a project\n"

KERNEL = """
[project]
name = "paths"

[[kernel]]
id = "relu2"
type = "pytorch"
entry = "kernel"

[kernel.baseline]
id = "good"
source = "good.py"
{baseline}
[[kernel.candidates]]
id = "x"
source = {source}
{candidate}
[[kernel.testcases]]
spec = "spec.py"
shapes = [[8, 8]]
{testcase}
{extra}
"""


@pytest.fixture
def layout(tmp_path):
    """A project folder beside a folder outside it that holds a secret, and links from one to the other."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text(SECRET)
    (outside / "trace.json").write_text("{}")
    root = tmp_path / "project"
    root.mkdir()
    for name in ("good.py", "spec.py"):
        (root / name).write_text((FIXTURES / "adversarial" / name).read_text())
    os.symlink(outside / "secret.py", root / "link_out.py")
    os.symlink(outside, root / "folder_out")
    os.symlink("good.py", root / "link_in.py")
    return root, outside


def manifest(
    root: Path, source: str = '"good.py"', baseline: str = "", candidate: str = "", testcase: str = "", extra: str = ""
) -> Path:
    path = root / "magpie.toml"
    path.write_text(
        KERNEL.format(source=source, baseline=baseline, candidate=candidate, testcase=testcase, extra=extra)
    )
    return path


def refused(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_manifest(path)
    return str(caught.value)


def snapshot_bytes(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in (root / "workspaces").rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    "source, real",
    [
        ('"/etc/passwd"', "/etc/passwd"),
        ('"../../../../../../../../etc/passwd"', "/etc/passwd"),
        ('"link_out.py"', "outside/secret.py"),
        ('"folder_out/secret.py"', "outside/secret.py"),
    ],
)
def test_a_source_outside_the_project_is_one_line_and_nothing_is_read(layout, source, real):
    root, outside = layout
    manifest(root, source)
    proc = magpie("build", cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    shown = real if real.startswith("/") else str(outside.parent / real)
    assert line == (
        f"magpie: magpie.toml: kernel relu2, implementation x: source {source} resolves outside the "
        f"project ({shown}); keep sources inside {root}"
    )
    assert not (root / "workspaces").exists()


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"candidate": 'source_files = ["link_out.py"]'}, 'implementation x: source_files[0] "link_out.py"'),
        ({"candidate": 'working_dir = "../outside"'}, 'implementation x: working_dir "../outside"'),
        ({"baseline": 'working_dir = "/etc"'}, 'implementation good: working_dir "/etc"'),
        ({"testcase": 'working_dir = "folder_out"'}, 'kernel relu2: testcases[0].working_dir "folder_out"'),
        ({"testcase": 'spec_files = ["link_out.py"]'}, 'kernel relu2: testcases[0].spec_files[0] "link_out.py"'),
        (
            {"extra": '[[kernel.testcases]]\nspec = "folder_out/secret.py"\nshapes = [[8, 8]]'},
            'kernel relu2: testcases[1].spec "folder_out/secret.py"',
        ),
        ({"extra": '[[traces]]\nid = "t"\ndir = "folder_out"'}, 'traces t: dir "folder_out"'),
        ({"extra": '[[traces]]\nid = "t"\ndir = "leaky"'}, 'traces t: dir "leaky" holds leak.json'),
        (
            {"extra": '[[traces]]\nid = "t"\ndir = "traces"\nkernel_source_repos = ["../outside"]'},
            'traces t: kernel_source_repos[0] "../outside"',
        ),
        ({"extra": '[[benchmark]]\nid = "b"\nengine = "vllm"\nmodel = "/etc"'}, 'benchmark b: model "/etc"'),
        (
            {"extra": '[[benchmark]]\nid = "b"\nengine = "vllm"\nmodel = "models/m"'},
            'benchmark b: model "models/m" holds config.json',
        ),
        (
            {
                "extra": '[[rule]]\nname = "extra"\nscope = "project"\ninputs = ["../outside/secret.py"]\naction = "true"'
            },
            'rule extra: inputs[0] "../outside/secret.py"',
        ),
        (
            {
                "extra": '[[rule]]\nname = "extra"\nscope = "project"\ninputs = ["magpie-templates/../../../../etc/passwd"]\n'
                'action = "true"'
            },
            'rule extra: inputs[0] "magpie-templates/../../../../etc/passwd" resolves outside magpie\'s templates',
        ),
    ],
)
def test_every_path_field_is_kept_inside(layout, fields, problem):
    root, outside = layout
    (root / "traces").mkdir()
    (root / "leaky").mkdir()
    os.symlink(outside / "trace.json", root / "leaky" / "leak.json")
    (root / "models" / "m").mkdir(parents=True)
    os.symlink(outside / "secret.py", root / "models" / "m" / "config.json")
    line = refused(manifest(root, **fields))
    assert line.startswith(f"{root / 'magpie.toml'}: ") and problem in line, line
    assert "resolves outside" in line


def test_links_and_folders_inside_the_project_stay_allowed(layout):
    root, _ = layout
    (root / "traces" / "h200").mkdir(parents=True)
    os.symlink("../../good.py", root / "traces" / "h200" / "run.json")  # inside, through a link
    loaded, _ = load_manifest(
        manifest(
            root,
            '"link_in.py"',
            candidate='working_dir = "."',
            extra='[[traces]]\nid = "t"\ndir = "traces"\n'
            '[[benchmark]]\nid = "b"\nengine = "vllm"\nmodel = "org/hub-id"',
        )
    )
    assert loaded.kernel[0].candidates[0].source == "link_in.py"


def test_a_link_retargeted_outside_after_a_build_stops_the_next_one(tmp_path):
    """The no-op fast path trusts what it saw last time only while every input's stat holds:
    a link turned to point outside is a full load, which refuses it."""
    write(tmp_path, COMMAND_PROJECT)
    (tmp_path / "k1" / "a.py").unlink()
    os.symlink("b.py", tmp_path / "k1" / "a.py")
    assert build_json(tmp_path)["failed"] == []
    secret = tmp_path / "secret.py"
    secret.write_text(SECRET)
    (tmp_path / "k1" / "a.py").unlink()
    os.symlink(Path("/etc/passwd"), tmp_path / "k1" / "a.py")
    proc = magpie("build", cwd=tmp_path)
    assert proc.returncode == 2 and 'source "k1/a.py" resolves outside the project (/etc/passwd)' in proc.stderr
    assert Path("/etc/passwd").read_bytes() not in snapshot_bytes(tmp_path)


def test_a_kernel_config_keeps_its_paths_inside_its_folder(layout):
    root, _ = layout
    cases = {
        "source_files: [../outside/secret.py]": 'kernel: source_files[0] "../outside/secret.py"',
        "source_files: [good.py, link_out.py]": 'kernel: source_files[1] "link_out.py"',
        "source: /etc/passwd": 'kernel: source_files[0] "/etc/passwd" resolves outside the project (/etc/passwd)',
        "source_files: [good.py]\n  spec: folder_out/secret.py": 'kernel: spec "folder_out/secret.py"',
        "source_files: [secret.py]\n  working_dir: folder_out": 'kernel: working_dir "folder_out"',
    }
    for fields, problem in cases.items():
        (root / "k.yaml").write_text(f"kernel:\n  id: k\n  type: pytorch\n  {fields}\n")
        with pytest.raises(UserError) as caught:
            load_kernel_config(root / "k.yaml")
        assert f"{root / 'k.yaml'}: {problem}" in str(caught.value) and "resolves outside" in str(caught.value)
    (root / "k.yaml").write_text("kernel:\n  id: k\n  type: pytorch\n  source_files: [link_in.py]\n  spec: spec.py\n")
    kernels, _ = load_kernel_config(root / "k.yaml")
    assert kernels[0].impl.source == "good.py"


def test_a_one_shot_run_keeps_to_the_current_folder(layout):
    """analyze and compare: files named on the command line make a project of the current folder."""
    root, outside = layout
    proc = magpie(
        "analyze",
        str(outside / "secret.py"),
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--testcase",
        "true",
        "--no-perf",
        "-o",
        "out",
        cwd=root,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        f'source "{outside / "secret.py"}" resolves outside the project ({outside / "secret.py"}); '
        f"keep sources inside {root}"
    ) in proc.stderr
    assert SECRET.encode() not in snapshot_bytes(root / "out")
