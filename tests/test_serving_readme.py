"""The README's serving commands, their own words, run by a shell whose `python` and `magpie` are a fresh venv's
(issue 40: "the README's serving commands all work as written on a fresh machine (venv)"): the tiny model, the
local run, the YAML run of the README's `bench.yaml`, the comparison of those two runs and the profiled run, each
against the real `transformers serve` on the CPU. The README's `/tmp/tiny` is replaced by a folder of the test's own
and the hub is kept offline (HF_HUB_OFFLINE=1): nothing else is added to the commands, so they use the engine's
default port (8000). Not here: `pip install` (the venv is made offline as in tests/test_serving_venv_docker.py), the
vLLM line (a GPU and vLLM: unverified, docs/compatibility.md says so), the docker line
(tests/test_serving_venv_docker.py), the sweep (tests/test_serving_sweep_transformers.py) and the comparison of
repeats, whose folder names stand for the reader's runs (tests/test_serving_compare.py)."""

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import editable_venv

from magpie.serving.runner import REPORT

REPO = Path(__file__).resolve().parents[1]


def _line(text: str, pattern: str) -> str:
    """A README command (with its continuation line, where it has one), its trailing comment dropped."""
    found = re.search(pattern, text, re.M)
    assert found, f"the README's serving example changed (no {pattern!r}): update this test"
    return re.sub(r"[ \t]+#[^\n]*", "", found.group(0))


def readme_script(model: Path) -> str:
    text = (REPO / "README.md").read_text()
    yaml = re.search(r"^```yaml\n(benchmark:.*?)^```", text, re.M | re.S)
    assert yaml, "the README's bench.yaml changed: update this test"
    commands = [
        _line(text, r"^python -m magpie\.serving\.tiny_model /tmp/tiny.*$"),
        _line(text, r"^magpie benchmark transformers -m /tmp/tiny --concurrency .*\\\n.*$"),
        f"cat > bench.yaml <<'EOF'\n{yaml.group(1)}EOF",
        _line(text, r"^magpie benchmark --benchmark-config bench\.yaml .*$"),
        _line(text, r"^magpie benchmark --compare results/tiny results/yaml.*$"),
        _line(text, r"^magpie benchmark transformers .*\\\n.*--torch-profiler.*$"),
    ]
    return "\n".join(commands).replace("/tmp/tiny", str(model))


@pytest.fixture(scope="module")
def ran():
    root = Path(tempfile.mkdtemp(prefix="magpie-readme-serving-"))
    venv = editable_venv(root / "venv")
    work = root / "work"
    work.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "HF_HUB_OFFLINE": "1",
    }
    script = readme_script(work / "tiny")
    proc = subprocess.run(["bash", "-ec", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    yield proc, work / "results", script
    shutil.rmtree(root)


def _report(folder: Path) -> dict:
    report = json.loads((folder / REPORT).read_text())
    assert report["success"] and report["errors"] == [], report["errors"]
    return report


def test_every_readme_serving_command_runs_as_written_from_a_venv(ran):
    proc, results, script = ran
    assert proc.returncode == 0, script + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    local, yaml = _report(results / "tiny"), _report(results / "yaml")
    for report in (local, yaml):
        assert report["run"]["completed"] == 20 and report["run"]["total_output_tokens"] == 20 * 32
        assert report["framework"] == "transformers" and report["reward_eligible"]
    assert "workload: ISL 64, OSL 32, 20 prompts, concurrency 4" in proc.stdout  # the comparison's table
    profiled = _report(results / "tiny-profiled")
    assert profiled["run"]["completed"] == 8 and profiled["run_kind"] == "diagnostic"
    assert list((results / "tiny-profiled" / "torch_trace").glob("*.pt.trace.json"))
    assert profiled["tracelens_analysis"]["analysis_mode"] == "inference"
