"""Putting a kernel into the workload (issue 43, point 4): the start-up hook in a real `transformers serve` of the
tiny offline model, reaching the spawned process that runs the model; the records the runner reads and the
report's provenance; a target that does not exist failing the run in one line before a server starts; the
manifest's and the comparison's refusals, each one line."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import magpie_in_process
from loop_fixtures import FIXTURES, TARGET, two_free_ports

from magpie.serving.replacement import Replacement, ReplacementError, write_hook


def replacement(source: Path, target: str = TARGET) -> Replacement:
    return Replacement(
        kernel="rmsnorm",
        implementation=source.stem,
        chosen_by="named",
        target=target,
        function="forward",
        source_name=source.name,
        source_digest=hashlib.sha256(source.read_bytes()).hexdigest(),
        correctness_state="SUCCESS",
    )


def run_with(tmp: Path, tiny_model: Path, put_in: Replacement):
    from magpie.serving.replacement import hook_environment
    from magpie.serving.report import BenchmarkConfig
    from magpie.serving.runner import run_benchmark

    shutil.copy(FIXTURES / "fused.py", tmp / "fused.py")
    hook = write_hook(tmp / "hook", [put_in], tmp)
    config = BenchmarkConfig(
        framework="transformers",
        model=str(tiny_model),
        port=two_free_ports(),
        input_len=8,
        output_len=4,
        num_prompts=4,
        concurrency=2,
        timeout_s=300,
        output_dir=str(tmp / "run"),
        env=hook_environment(hook, {}),
        replacement_hook=str(hook),
        replacements=[put_in],
    )
    return run_benchmark(config)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("replaced")
    shutil.copy(FIXTURES / "fused.py", tmp / "fused.py")
    return run_with(tmp, tiny_model, replacement(tmp / "fused.py"))


def test_the_hook_reaches_the_process_that_runs_the_model_and_the_report_records_it(served):
    assert served.success, served.errors
    (recorded,) = served.provenance.replacements
    assert recorded["target"] == TARGET and recorded["implementation"] == "fused"
    assert recorded["source_digest"] == hashlib.sha256((FIXTURES / "fused.py").read_bytes()).hexdigest()
    # transformers 5.25 runs the model in a process it spawns: the replacement was called there, not in the
    # server's own process
    assert recorded["called_pids"] and served.server.pid not in recorded["called_pids"]
    assert set(recorded["called_pids"]) <= set(recorded["installed_pids"])


def test_a_target_that_does_not_exist_fails_the_run_in_one_line_before_a_server_starts(tmp_path, tiny_model):
    shutil.copy(FIXTURES / "fused.py", tmp_path / "fused.py")
    report = run_with(tmp_path, tiny_model, replacement(tmp_path / "fused.py", TARGET.replace("forward", "forwrd")))
    assert not report.success
    assert len(report.errors) == 1 and "\n" not in report.errors[0], report.errors
    assert "has no attribute 'forwrd'" in report.errors[0], report.errors
    assert report.server is None and not (tmp_path / "run" / "server.log").exists()  # no server, no request


def test_the_manifest_refuses_a_use_that_cannot_be_put_in(tmp_path):
    base = """
[[kernel]]
id = "rmsnorm"
type = "pytorch"
entry = "rmsnorm"
{replaces}
baseline = {{ id = "torch", source = "baseline.py" }}

[[kernel.testcases]]
spec = "spec.py"
shapes = [[8, 64]]

[[benchmark]]
id = "b"
engine = "transformers"
model = "m"
use = {use}
"""
    for name in ("spec.py", "baseline.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "m").mkdir()
    cases = {
        ("", '{ rmsnorm = "best" }'): "declares no `replaces`",
        (f'replaces = "{TARGET}"', '{ norm = "best" }'): "use names kernel 'norm', which is not declared",
        (f'replaces = "{TARGET}"', '{ rmsnorm = "fast" }'): 'give "best" or one of its implementations (torch)',
        ('replaces = "not a path"', '{ rmsnorm = "best" }'): "replaces",
    }
    for (replaces, use), expected in cases.items():
        (tmp_path / "magpie.toml").write_text(base.format(replaces=replaces, use=use))
        proc = magpie_in_process("build", "--dry-run", cwd=tmp_path)
        assert proc.returncode == 2, (use, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (use, proc.stderr)


def comparison(best: str | None, fused_state: str = "SUCCESS") -> dict:
    row = {"is_baseline": False, "speedup": {"value": 1.2}, "verdict": "wrong output at [3, 7]"}
    return {
        "comparison:rmsnorm": {
            "best": best,
            "results": [
                {**row, "implementation": "torch", "is_baseline": True, "correctness_state": "SUCCESS"},
                {**row, "implementation": "fused", "correctness_state": fused_state},
            ],
        }
    }


def test_best_without_a_winner_and_an_incorrect_implementation_are_never_put_in(tmp_path):
    from magpie.serving.ab import resolve

    shutil.copy(FIXTURES / "fused.py", tmp_path / "fused.py")
    replacing = {"rmsnorm": {"target": TARGET, "function": "forward", "sources": {"fused": "fused.py"}}}
    with pytest.raises(ReplacementError, match="has no winner"):
        resolve({"use": {"rmsnorm": "best"}}, replacing, comparison(None), {}, tmp_path)
    with pytest.raises(ReplacementError, match=r"rmsnorm/fused is not correct \(FAILED: wrong output"):
        resolve({"use": {"rmsnorm": "fused"}}, replacing, comparison(None, "FAILED"), {}, tmp_path)
    (chosen,) = resolve({"use": {"rmsnorm": "best"}}, replacing, comparison("fused"), {}, tmp_path)
    assert (chosen.implementation, chosen.chosen_by, chosen.speedup) == ("fused", "best", {"value": 1.2})


def test_a_replacement_the_served_model_never_calls_fails_the_run_in_one_line(tmp_path, tiny_model):
    # imported with the model's module (installed), but a class the served causal LM never runs
    unused = TARGET.replace("LlamaRMSNorm", "LlamaForSequenceClassification")
    shutil.copy(FIXTURES / "fused.py", tmp_path / "fused.py")
    report = run_with(tmp_path, tiny_model, replacement(tmp_path / "fused.py", unused))
    assert not report.success and report.run is not None and report.run.completed > 0
    assert report.errors == [
        f"rmsnorm/fused in place of {unused!r} was installed but never called: the served model does not run "
        f"that target"
    ]
    assert report.provenance.replacements == []


def hooked_python(tmp: Path, code: str, *flags: str, pythonpath: list[Path] = ()):
    """`code` in a fresh interpreter whose PYTHONPATH starts with the hook folder `tmp/hook`."""
    import os
    import subprocess
    import sys

    path = os.pathsep.join(str(p) for p in [tmp / "hook", *pythonpath])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def stdlib_replacement(tmp: Path) -> Replacement:
    """json's decoder replaced by one that adds 1 to what it decodes: a target any interpreter has, no torch."""
    (tmp / "plus_one.py").write_text(
        "import json.decoder\n\n_original = json.decoder.JSONDecoder.decode\n\n\n"
        "def decode(self, s, *args, **kwargs):\n    return _original(self, s, *args, **kwargs) + 1\n"
    )
    put_in = replacement(tmp / "plus_one.py", "json.decoder.JSONDecoder.decode").model_copy(
        update={"function": "decode"}
    )
    write_hook(tmp / "hook", [put_in], tmp)
    return put_in


def test_the_hook_patches_at_interpreter_start_and_records_it(tmp_path):
    from magpie.serving.replacement import records

    stdlib_replacement(tmp_path)
    proc = hooked_python(tmp_path, "import json; print(json.loads('41'))")
    assert proc.stdout.strip() == "42", proc.stderr
    found = records(tmp_path / "hook")
    assert len(found["installed"]) == len(found["called"]) == 1 and not found["failed"]
    assert found["called"][0]["target"] == "json.decoder.JSONDecoder.decode"


def test_vllms_plugin_route_finds_the_hooks_entry_point_without_sitecustomize(tmp_path):
    """vLLM loads `vllm.general_plugins` entry points in each of its processes: the hook folder's distribution
    metadata is found on PYTHONPATH and its `install` patches, with `site` (so sitecustomize) off. vLLM itself is
    not installed here: its loader is stood for by importlib.metadata, which it calls."""
    stdlib_replacement(tmp_path)
    code = (
        "from importlib.metadata import entry_points\n"
        "[e.load()() for e in entry_points(group='vllm.general_plugins') if e.name == 'magpie_replacement']\n"
        "import json; print(json.loads('1'))"
    )
    assert hooked_python(tmp_path, "import json; print(json.loads('1'))", "-S").stdout.strip() == "1"
    proc = hooked_python(tmp_path, code, "-S")
    assert proc.stdout.strip() == "2", proc.stderr


def test_a_sitecustomize_the_hook_shadows_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS = True\n")
    stdlib_replacement(tmp_path)
    proc = hooked_python(tmp_path, "import json; print(THEIRS, json.loads('1'))", pythonpath=[theirs])
    assert proc.stdout.strip() == "True 2", proc.stderr
