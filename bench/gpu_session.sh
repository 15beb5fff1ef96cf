#!/usr/bin/env bash
# One device call: environment facts, GPU tests, the GPU example, calibration, fidelity
# benchmark. Everything lands in $OUT/gpu_session.tar.gz plus a short log.
# The GPU machine lacks magpie's pure-Python dependencies and has no package index: fetch them
# as wheels into .whl/ first (pydantic, pydantic-core, annotated-types, typing-inspection, doit,
# msgspec; cp312 manylinux x86_64) and carry .whl with the call.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
# bytecode as an install leaves it: the machine sets PYTHONDONTWRITEBYTECODE, and every process
# compiled its modules from source (0.3 s of a build's main process alone)
python3 -m compileall -q -j 8 magpie ${PYTHONPATH%%:*} >/dev/null 2>&1
# a lent machine can keep /tmp between sessions: files of an earlier call must not pass for this one's
rm -rf /tmp/s && mkdir -p /tmp/s
{
  date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
  ncu --version | tail -1
} > /tmp/s/env.txt 2>&1
python3 -m magpie --gpu-info --json > /tmp/s/gpu_info.json 2>&1
status=0  # the exit status: the GPU tests' where they ran, else 0 (the summary below may find files missing)
for step in "$@"; do
  case "$step" in
    tests) # every GPU test; each failure written as it happens (a run cut at the call's limit never reaches pytest's summary)
           MAGPIE_TEST_FAILURES_AT_ONCE=1 timeout ${TESTS_S:-540} python3 -m pytest -m gpu -v -p no:cacheprovider tests/ --basetemp=/tmp/gpu_pytest > /tmp/s/gpu_tests.txt 2>&1;
           status=$?;
           cp -r /tmp/gpu_pytest/gpu0/examples/gpu/workspaces/reports /tmp/s/test_reports 2>/dev/null;
           find /tmp/gpu_pytest -name ncu.csv -exec sh -c 'cp "$1" /tmp/s/ncu_$(basename $(dirname "$1")).csv' _ {} \; ;;
    sandbox) # does CUDA (and CUDA IPC, ncu) still work under every layer of the sandbox
             timeout 120 python3 bench/sandbox_layers.py > /tmp/s/sandbox_layers.txt 2>&1
             timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_sandbox.py \
               --basetemp=/tmp/gpu_pytest > /tmp/s/gpu_tests.txt 2>&1; status=$? ;;
    sandbox_cpu) # the sandbox's CPU-side limits (pids cgroup, write quota, device nodes) on this host
             timeout ${SANDBOX_CPU_S:-200} python3 -m pytest -q -p no:cacheprovider -m "not gpu" tests/test_sandbox.py \
               --basetemp=/tmp/cpu_pytest > /tmp/s/sandbox_cpu.txt 2>&1 ;;
    example) (cd examples/gpu && timeout 240 python3 -m magpie build --plain > /tmp/s/example_build.txt 2>&1;
              cp -r workspaces/reports /tmp/s/example_reports;
              find workspaces/store -name ncu.csv -exec sh -c 'cp "$1" /tmp/s/ncu_$(basename $(dirname "$1")).csv' _ {} \; ) ;;
    metrics) ncu --query-metrics --chip gh100 > /tmp/s/ncu_metrics.txt 2>&1 ;;
    calibrate) timeout 120 python3 -m magpie calibrate --json > /tmp/s/calibration.json 2>&1 ;;
    fidelity) timeout 480 python3 bench/gpu_fidelity.py --parts timers --out /tmp/s > /tmp/s/fidelity.txt 2>&1 ;;
    fidelity2) timeout 300 python3 bench/gpu_fidelity.py --parts timers --only "gemm,bandwidth (x" --out /tmp/s/f2 > /tmp/s/fidelity2.txt 2>&1 ;;
    fidelity3) timeout 450 python3 bench/gpu_fidelity.py --parts timers --only "gemm,bandwidth" --out /tmp/s/f3 > /tmp/s/fidelity3.txt 2>&1 ;;
    gemms) timeout 400 python3 bench/gpu_fidelity.py --parts timers --only "gemm" --out /tmp/s/gemms > /tmp/s/gemms.txt 2>&1 ;;
    short) timeout 200 python3 bench/gpu_fidelity.py --parts timers --only "one element" --out /tmp/s/short > /tmp/s/short.txt 2>&1 ;;
    gemm) timeout 120 python3 bench/gemm_timer_variants.py /tmp/s/gemm_variants.json > /tmp/s/gemm.txt 2>&1 ;;
    triton_first) timeout 200 python3 bench/triton_first_call.py /tmp/s/triton_first_call.json > /tmp/s/triton_first.txt 2>&1 ;;
    startup) timeout 200 python3 bench/cuda_startup.py /tmp/s/cuda_startup.json > /tmp/s/startup.txt 2>&1 ;;
    traces) timeout 150 python3 bench/capture_traces.py /tmp/s/traces ${CAPTURES:-serving_steps,llama_unannotated,conv_net,fp8_scaled_mm} > /tmp/s/traces.txt 2>&1 ;;
    nccl) timeout 120 python3 bench/capture_traces.py /tmp/s/traces tp2_collectives >> /tmp/s/traces.txt 2>&1 ;;
    sweep) python3 bench/timer_sweep.py /tmp/s/timer_sweep.json --timeout ${SWEEP_S:-280} > /tmp/s/sweep.txt 2>&1 ;;
    sweep_vouched) python3 bench/timer_sweep.py /tmp/s/timer_sweep_vouched.json --vouched --only "${SWEEP_ONLY:-}" \
                  --timeout ${SWEEP_S:-280} \
                  > /tmp/s/sweep_vouched.txt 2>&1 ;;
    sweep_swap) python3 bench/timer_sweep.py /tmp/s/timer_sweep_swap.json --swap --timeout ${SWEEP_S:-200} \
                  > /tmp/s/sweep_swap.txt 2>&1 ;;
    vouched_check) # the vouched clock's figures in one call: cheats and an honest relu against the worker's
                   # timer, a sweep over 1 µs-3 ms kernels, the vouched GPU tests (at most 9 minutes)
                   timeout 200 python3 bench/gpu_vouched.py /tmp/s/gpu_vouched.json > /tmp/s/vouched.txt 2>&1
                   python3 bench/timer_sweep.py /tmp/s/timer_sweep_vouched.json --vouched --timeout 150 \
                     --only scale_add_2p10,scale_add_2p18,scale_add_2p22,scale_add_2p26,scale_add_2p28,gemm_bf16_4096,loop200 \
                     > /tmp/s/sweep_vouched.txt 2>&1
                   timeout 190 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_implausible_timing.py \
                     tests/test_gpu.py -k "vouched or side_stream or gate or aliases" --basetemp=/tmp/gpu_pytest \
                     > /tmp/s/gpu_tests.txt 2>&1; status=$? ;;
    default_check) # the default (vouched) GPU timing in one call of at most 8 minutes: the sweep's kernels
                   # whose copies and batches were priced wrong before, then the kept-warm compare's cost
                   python3 bench/timer_sweep.py /tmp/s/timer_sweep_vouched.json --vouched --timeout 150 \
                     --only scale_add_2p14,scale_add_2p18,scale_add_2p26,scale_add_2p28,gemm_bf16_4096 \
                     > /tmp/s/sweep_vouched.txt 2>&1
                   timeout 300 python3 bench/interval_coverage.py /tmp/s/interval_coverage.json --runs 3 --edits 2 \
                     > /tmp/s/coverage.txt 2>&1 ;;
    ipc) timeout 120 python3 bench/ipc_bandwidth.py /tmp/s/ipc_bandwidth.json > /tmp/s/ipc.txt 2>&1 ;;
    vouched) timeout ${VOUCHED_S:-200} python3 bench/gpu_vouched.py /tmp/s/gpu_vouched.json ${VOUCHED_SHAPES:-} \
               > /tmp/s/vouched.txt 2>&1 ;;
    coverage) timeout ${COVERAGE_S:-300} python3 bench/interval_coverage.py /tmp/s/interval_coverage.json \
                --runs ${COVERAGE_RUNS:-10} --edits ${COVERAGE_EDITS:-1} > /tmp/s/coverage.txt 2>&1 ;;
    throughput) timeout 560 python3 bench/gpu_fidelity.py --parts throughput --out /tmp/s > /tmp/s/throughput.txt 2>&1 ;;
  esac
done
tar czf "$OUT/gpu_session.tar.gz" -C /tmp s || { echo "gpu_session: no archive written" >&2; [ "$status" -ne 0 ] || status=1; }
cat /tmp/s/env.txt; cat /tmp/s/sandbox_layers.txt 2>/dev/null; cat /tmp/s/ipc.txt /tmp/s/vouched.txt 2>/dev/null | grep -v '^ *[{}"]' | cut -c1-400; tail -15 /tmp/s/gpu_tests.txt 2>/dev/null; tail -8 /tmp/s/sandbox_cpu.txt 2>/dev/null; tail -20 /tmp/s/example_build.txt 2>/dev/null
grep -E "FAILED|build exit" /tmp/s/sweep.txt /tmp/s/sweep_swap.txt /tmp/s/sweep_vouched.txt 2>/dev/null | cut -c1-220; tail -14 /tmp/s/coverage.txt 2>/dev/null; cat /tmp/s/gemm.txt 2>/dev/null; cat /tmp/s/startup.txt /tmp/s/triton_first.txt 2>/dev/null; cat /tmp/s/traces.txt 2>/dev/null; tail -30 /tmp/s/throughput.txt 2>/dev/null; tail -30 /tmp/s/fidelity.txt 2>/dev/null; grep -E '"(ncu_median_us|do_bench_median_us|magpie_median_us|magpie_repeat_cv)"|gemm' /tmp/s/gemms.txt 2>/dev/null; tail -25 /tmp/s/short.txt 2>/dev/null; head -c 600 /tmp/s/calibration.json 2>/dev/null
exit $status
