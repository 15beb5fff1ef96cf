"""The repository's promises about itself: README commands, CI, layout."""

import re
import subprocess
import sys

from conftest import REPO


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", setup)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2
    assert commands[0].endswith("magpie build")
    assert commands[1].endswith("python -m pytest")
    ci_lines = [line for line in (REPO / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert commands[1] in ci_lines


def test_design_card_layout():
    for name in (
        "magpie",
        "rules",
        "templates",
        "workspaces",
        "tests",
        "dodo.py",
        "magpie.toml",
        "pyproject.toml",
        "README.md",
        "docs/architecture/README.md",
        "docs/compatibility.md",
        "docs/performance.md",
    ):
        assert (REPO / name).exists(), name


def test_importing_magpie_imports_no_heavy_package():
    code = (
        "import sys, magpie, magpie.cli, magpie.project, magpie.execution.doit_glue, magpie.execution.actions, "
        "magpie.report.render; print([m for m in ('torch', 'triton', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_magpie_runs():
    out = subprocess.run([sys.executable, "-m", "magpie", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("magpie ")
