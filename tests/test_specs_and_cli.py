"""Reference styles (function, KernelBench, command, none) and the one-shot verbs. The verbs run
in this process (`magpie_in_process`) where only their exit code, output and files are checked."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import FIXTURES, REPO, SPIN_SOURCE, magpie, magpie_in_process, write


@pytest.fixture
def kernels(tmp_path):
    for name in ("good.py", "nan.py", "spec.py", "mutates.py"):
        shutil.copy(FIXTURES / "adversarial" / name, tmp_path / name)
    for name in ("reference.py", "model_new.py", "model_new_wrong.py"):
        shutil.copy(FIXTURES / "kernelbench" / name, tmp_path / name)
    return tmp_path


def test_analyze_correct_kernel_writes_magpie_state_keys(kernels):
    proc = magpie_in_process(
        "analyze",
        "good.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "spec.py",
        "--shapes",
        "16x32,5x7",
        "--budget-ms",
        "40",
        "-o",
        "out",
        cwd=kernels,
        check=0,
    )
    report = json.loads((kernels / "out/analyze_report.json").read_text())
    for key in (
        "compiling_state",
        "correctness_state",
        "performance_state",
        "performance_result",
        "errors",
        "numerics",
    ):
        assert key in report
    assert report["correctness_state"] == "SUCCESS" and report["numerics"] == "verified"
    assert report["performance_state"] == "SUCCESS" and report["performance_result"]["n"] > 0
    assert "median" in proc.stdout


def test_analyze_incorrect_kernel_exits_nonzero_and_no_perf_skips_timing(kernels):
    proc = magpie_in_process(
        "analyze",
        "nan.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "spec.py",
        "--shapes",
        "16x32",
        "--no-perf",
        "-o",
        "out",
        cwd=kernels,
    )
    assert proc.returncode == 1
    report = json.loads((kernels / "out/analyze_report.json").read_text())
    assert report["correctness_state"] == "FAILED" and report["performance_state"] == "SKIPPED"


def test_command_testcase_exit_code_decides(kernels):
    ok = magpie_in_process(
        "analyze", "good.py", "--type", "pytorch", "--testcase", "test -f good.py", "--no-perf", "-o", "a", cwd=kernels
    )
    bad = magpie_in_process(
        "analyze", "good.py", "--type", "pytorch", "--testcase", "exit 3", "--no-perf", "-o", "b", cwd=kernels
    )
    assert ok.returncode == 0 and bad.returncode == 1
    report = json.loads((kernels / "b/analyze_report.json").read_text())
    assert "exited with code 3" in report["verdict"]


def test_no_testcase_is_finite_only_and_says_unverified(kernels):
    (kernels / "own_inputs.py").write_text(
        "import torch\n\ndef kernel(x):\n    return x.sin()\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n"
    )
    magpie_in_process(
        "analyze",
        "own_inputs.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--no-perf",
        "-o",
        "o",
        cwd=kernels,
        check=0,
    )
    report = json.loads((kernels / "o/analyze_report.json").read_text())
    assert report["correctness_state"] == "SUCCESS" and report["numerics"] == "unverified"


def test_kernelbench_reference_judges_model_new(kernels):
    write(
        kernels,
        {
            "kb.yaml": """
        kernels:
          - {id: right, type: pytorch, source_files: [model_new.py], spec: reference.py}
          - {id: wrong, type: pytorch, source_files: [model_new_wrong.py], spec: reference.py}
        """
        },
    )
    magpie_in_process("compare", "--kernel-config", "kb.yaml", "--no-perf", "-o", "kb", cwd=kernels, check=0)
    report = json.loads((kernels / "kb/compare_report.json").read_text())
    states = {r["implementation"]: (r["correctness_state"], r["verdict"]) for r in report["results"]}
    assert states["right"] == ("SUCCESS", "correct")
    assert states["wrong"][0] == "FAILED" and "kernelbench" in states["wrong"][1]


def test_a_kernelbench_timing_job_takes_the_worker_its_correctness_job_parked(kernels):
    write(
        kernels,
        {
            "kb.yaml": """
        kernels:
          - {id: right, type: pytorch, source_files: [model_new.py], spec: reference.py}
        """
        },
    )
    magpie_in_process("compare", "--kernel-config", "kb.yaml", "--budget-ms", "20", "-o", "kb", cwd=kernels)
    results = [json.loads(p.read_text()) for p in (kernels / "kb/workspace/store").glob("*/*/result.json")]
    timing = next(r for r in results if r.get("task") == "timing:compare/right")
    assert timing["performance_state"] == "SUCCESS" and timing["workers_adopted"] == {"candidate": True}


def test_compare_uses_the_explicit_baseline_and_gates_correctness(kernels):
    (kernels / "slow.py").write_text(
        SPIN_SOURCE + "\n\ndef kernel(x):\n    spin(0.0005)\n    return torch.relu(x) * 2.0\n"
    )
    proc = magpie_in_process(
        "compare",
        "slow.py",
        "good.py",
        "mutates.py",
        "--baseline",
        "1",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "spec.py",
        "--shapes",
        "16x32",
        "--budget-ms",
        "60",
        "-o",
        "c",
        "--json",
        cwd=kernels,
        check=0,
    )
    report = json.loads(proc.stdout)
    assert report["baseline"] == "good"
    assert [e["implementation"] for e in report["excluded"]] == ["mutates"]
    slow = next(r for r in report["results"] if r["implementation"] == "slow")
    assert slow["speedup"]["verdict"] == "slower" and slow["speedup"]["ci_high"] < 1.0
    assert slow["speedup"]["baseline_median_us"] > 0
    # slow and its baseline each measured for the 60 ms budget while the job held the device
    assert slow["time_s"]["device_held"] >= 0.12 and slow["time_s"]["first_calls"] is not None
    assert slow["time_s"]["worker_starts"] > 0  # its correctness job's new worker, at least
    assert report["time_s"]["device_held"] >= slow["time_s"]["device_held"] + 0.06  # good's own timing too


def test_compare_bad_baseline_index_is_one_line(kernels):
    proc = magpie_in_process("compare", "good.py", "nan.py", "--type", "pytorch", "--baseline", "5", cwd=kernels)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--baseline" in proc.stderr


def test_compare_runs_a_job_per_implementation_within_the_cpus_by_default(monkeypatch):
    """Each implementation's correctness and timing jobs mostly wait for the device: with fewer
    slots than implementations the last one's check starts only when another ends."""
    from magpie.execution.oneshot import default_jobs

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert [default_jobs(n) for n in (1, 9, 40)] == [2, 9, 16]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert default_jobs(9) == 2
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert default_jobs(9) == 1


def test_compare_refuses_no_jobs_in_one_line(kernels):
    proc = magpie_in_process("compare", "good.py", "nan.py", "--type", "pytorch", "-j", "0", cwd=kernels, check=2)
    assert proc.stderr.count("\n") == 1 and "--jobs" in proc.stderr


def test_gpu_info_on_a_cpu_machine():
    proc = magpie_in_process("--gpu-info", cwd=REPO, check=0)
    assert "GPU: none found" in proc.stdout and "CPU:" in proc.stdout and "torch" in proc.stdout
    info = json.loads(magpie_in_process("--gpu-info", "--json", cwd=REPO, check=0).stdout)
    assert info["gpus"] == [] and info["cpu"]["cores"] >= 1 and "nvcc" in info["compilers"]


def test_help_answers():
    proc = magpie("--help", cwd=REPO, check=0)  # a process of its own: the `python -m magpie` entry point answers
    for verb in ("build", "clean", "analyze", "compare", "--gpu-info"):
        assert verb in proc.stdout
    assert "--kernel-config" in magpie_in_process("analyze", "--help", cwd=REPO, check=0).stdout


def test_a_spec_that_makes_zeros_is_refused(kernels):
    (kernels / "zeros_spec.py").write_text(
        "import torch\n\ndef make_inputs(shape, dtype, generator):\n    return (torch.zeros(shape, dtype=dtype),)\n"
        "\ndef reference(x):\n    return torch.relu(x) * 2.0\n"
    )
    proc = magpie_in_process(
        "analyze",
        "good.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "zeros_spec.py",
        "--shapes",
        "4x4",
        "--no-perf",
        "-o",
        "z",
        cwd=kernels,
    )
    assert proc.returncode == 1
    report = json.loads((kernels / "z/analyze_report.json").read_text())
    assert "all zeros" in report["verdict"] and report["verdict"].startswith("not judged: spec error in zeros_spec.py:")


def test_a_spec_whose_inputs_or_reference_fail_is_one_line_naming_it(kernels):
    (kernels / "broken_spec.py").write_text(
        "import torch\n\ndef make_inputs(shape, dtype, generator):\n"
        "    return (torch.randn(shape, generator=generator, device='meta'),)\n"
        "\ndef reference(x):\n    return torch.relu(x) * 2.0\n"
    )
    proc = magpie_in_process(
        "analyze",
        "good.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "broken_spec.py",
        "--shapes",
        "4x4",
        "--no-perf",
        "-o",
        "b",
        cwd=kernels,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    verdict = json.loads((kernels / "b/analyze_report.json").read_text())["verdict"]
    assert verdict.startswith("not judged: spec error in broken_spec.py: make_inputs() failed for [4, 4] float32: ")
    assert "\n" not in verdict and "inputs are made on cpu" in verdict
    (kernels / "broken_reference.py").write_text(
        "import torch\n\ndef make_inputs(shape, dtype, generator):\n"
        "    return (torch.randn(shape, generator=generator),)\n"
        "\ndef reference(x):\n    return x @ torch.ones(3, 3)\n"
    )
    magpie_in_process(
        "analyze",
        "good.py",
        "--type",
        "pytorch",
        "--entry",
        "kernel",
        "--spec",
        "broken_reference.py",
        "--shapes",
        "4x4",
        "--no-perf",
        "-o",
        "r",
        cwd=kernels,
        check=1,
    )
    verdict = json.loads((kernels / "r/analyze_report.json").read_text())["verdict"]
    assert verdict.startswith("not judged: spec error in broken_reference.py: reference() failed: RuntimeError: ")


def test_only_results_shaped_like_the_reference_go_into_lent_buffers():
    """Anything else travels as it is, so the checks name the wrong count, shape or dtype."""
    import torch

    from magpie.harness.exchange import _fits

    buffers = [(torch.empty(2, 3), torch.empty(4, dtype=torch.int64))]
    assert _fits(torch, [(torch.ones(2, 3), torch.ones(4, dtype=torch.int64))], buffers)
    assert not _fits(torch, [(torch.ones(3, 2), torch.ones(4, dtype=torch.int64))], buffers)
    assert not _fits(torch, [(torch.ones(2, 3), torch.ones(4))], buffers)
    assert not _fits(torch, [torch.ones(2, 3)], buffers)
    assert not _fits(torch, [(torch.ones(2, 3), 4)], buffers)
    assert _fits(torch, [torch.ones(5)], [(torch.empty(5),)])  # one output, as a tensor or a 1-tuple


def test_inputs_travel_as_files_where_cuda_ipc_is_switched_off(monkeypatch, tmp_path):
    import torch

    from magpie.environment import CUDA_IPC
    from magpie.harness.exchange import CudaIpcExchange, FileExchange, exchange_for

    assert type(exchange_for(torch, "cuda:0")) is CudaIpcExchange
    monkeypatch.setenv(CUDA_IPC, "0")
    assert type(exchange_for(torch, "cuda:0")) is FileExchange
    assert type(exchange_for(torch, "cpu")) is FileExchange


def test_a_reused_evaluator_forgets_project_modules_but_keeps_libraries(tmp_path):
    import importlib
    import sys

    from magpie.harness.declared import fresh_imports

    (tmp_path / "project_helper.py").write_text("VALUE = 1\n")
    path = list(sys.path)
    sys.modules.pop("wave", None)  # a standard-library module the suite does not otherwise use
    with fresh_imports():
        sys.path.insert(0, str(tmp_path))
        importlib.import_module("project_helper")
        importlib.import_module("wave")
    assert "project_helper" not in sys.modules and "wave" in sys.modules and sys.path == path


def test_inputs_are_the_seeds_whether_or_not_the_factory_takes_a_generator(tmp_path):
    """A factory with a `generator` parameter draws from the one it is given; one without draws
    from torch's global generator, seeded per set: either way a set's seed alone decides it."""
    from magpie.harness.spec import Case, ReferenceSpec
    from magpie.harness.wire import Testcase

    (tmp_path / "with_generator.py").write_text(
        "import torch\n\ndef make_inputs(shape, dtype, generator):\n"
        "    return (torch.randn(shape, generator=generator, dtype=dtype),)\n\ndef reference(x):\n    return x\n"
    )
    (tmp_path / "global_rng.py").write_text(
        "import torch\n\ndef make_inputs(shape, dtype):\n"
        "    return (torch.rand(shape, dtype=dtype), torch.randint(0, 9, shape))\n\ndef reference(x, i):\n    return x\n"
    )
    testcase = Testcase(inputs="make_inputs", reference="reference", shapes=[[5, 7]], dtypes=["float32"])
    for name in ("with_generator.py", "global_rng.py"):
        spec = ReferenceSpec(tmp_path / name, testcase, "cpu")
        first, again, other = (spec.make_inputs(Case("c", [5, 7], "float32", 0, seed)) for seed in (11, 11, 12))
        assert all(a.equal(b) for a, b in zip(first, again)), name
        assert not first[0].equal(other[0]), name


def test_the_command_leaves_without_teardown_yet_keeps_its_exit_code_output_atexit_and_threads(tmp_path):
    """`magpie` ends with os._exit after main (the interpreter's teardown cost 0.1 s a build):
    what a normal exit would have done must still happen."""
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from magpie import cli
        atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))
        def late():
            time.sleep(0.3)
            open({str(tmp_path / "thread")!r}, "w").write("done")
        def main():
            threading.Thread(target=late).start()
            sys.stdout.write("x" * (1 << 20))  # more than a pipe holds: flushed, not lost
            return 3
        cli.main = main
        cli.command()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stdout) == 1 << 20
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
