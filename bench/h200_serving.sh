#!/usr/bin/env bash
# One device call (nvidia-h200, carry [".whl"]): a random Llama-style model of ~0.38B parameters
# (magpie.serving.tiny_model, bf16) served by `transformers serve` on the GPU and benchmarked by
# `magpie benchmark transformers` twice: clean (measurement) and with --torch-profiler (diagnostic),
# whose traces magpie analyses (tracelens/, the inference stage split, gap analysis). Results:
# $OUT/serving.tar.gz, $OUT/serving_summary.txt and, if small enough, $OUT/profiled_trace.json.gz.
# Every step is bounded so the script ends within BUDGET_S (285) + ~15 s, whatever hangs.
#
# The machine has no index and lacks magpie's pure-Python dependencies and the `serving` extra of its
# transformers 5.17, so .whl/ holds them (cp312 manylinux x86_64): pydantic, pydantic-core,
# annotated-types, typing-inspection, doit, msgspec; openai 2.54.0 (3.x needs httpx2, the machine has
# httpx), fastapi 0.141.1 (later ones need opentelemetry-api), starlette, uvicorn, jiter, distro, sniffio.
#
# Without a GPU (what the CPU machines can check):
#   DEVICE=cpu SIZE=tiny INSTALL_WHEELS=0 OUT=/tmp/out bash bench/h200_serving.sh
set -uo pipefail
export PYTHONUNBUFFERED=1

DEVICE=${DEVICE:-cuda}               # the server's --device; cuda picks the GPU magpie allocates
SIZE=${SIZE:-large}                  # large: ~0.38B parameters, bf16; tiny: tiny_model's defaults, fp32
BUDGET_S=${BUDGET_S:-285}
INSTALL_WHEELS=${INSTALL_WHEELS:-1}
OUT=${OUT:-/tmp/h200_serving_out}
WORK=/tmp/h200_serving
MODEL=$WORK/model
PACK=$WORK/pack
START=$SECONDS

# Seconds a step may take: at most $1, and never past the budget less $2 (default 25) kept for packing.
cap() {
  local c=$1 r=$(( BUDGET_S - (SECONDS - START) - ${2:-25} ))
  (( r < c )) && c=$r
  (( c < 5 )) && c=5
  echo "$c"
}
say() { echo "[$(( SECONDS - START ))s] $*"; }

rm -rf "$WORK/clean" "$WORK/profiled" "$WORK/profiled_analysis" "$PACK"
mkdir -p "$OUT" "$PACK"

if [ "$INSTALL_WHEELS" = 1 ] && [ -d .whl ]; then
  say "installing .whl into /tmp/site"
  timeout "$(cap 60)" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$PACK/pip.txt" 2>&1 || say "pip install failed: $(tail -3 "$PACK/pip.txt")"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
# A local model folder: nothing is looked up on a hub, and no cache of the machine's is read.
export HF_HUB_OFFLINE=1 HF_HOME=$WORK/hf_home TRANSFORMERS_NO_ADVISORY_WARNINGS=1

say "environment"
{
  date -u
  command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
    --format=csv
  timeout "$(cap 60)" python3 - <<'EOF'
import sys
from importlib import metadata
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("transformers", "tokenizers", "openai", "fastapi", "starlette", "uvicorn", "pydantic", "httpx"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "MISSING")
from transformers.utils.import_utils import is_serve_available
import transformers.cli.serving.server  # what `transformers serve` imports once it starts
print("transformers serve available:", is_serve_available())
EOF
} > "$PACK/env.txt" 2>&1
cat "$PACK/env.txt"

if [ "$SIZE" = large ]; then
  SIZE_ARGS="--hidden-size 2048 --layers 8 --heads 16 --kv-heads 8 --intermediate-size 5632 --dtype bfloat16"
  PRECISION=bf16
else
  SIZE_ARGS=""
  PRECISION=auto
fi
say "building the model ($SIZE) in $MODEL"
rm -rf "$MODEL"
# shellcheck disable=SC2086
timeout "$(cap 90)" python3 -m magpie.serving.tiny_model "$MODEL" $SIZE_ARGS > "$PACK/model_build.txt" 2>&1 \
  || say "model build failed: $(tail -3 "$PACK/model_build.txt")"
cp "$MODEL/magpie_tiny_model.json" "$MODEL/config.json" "$PACK/" 2>/dev/null
du -sh "$MODEL" 2>/dev/null

# Stops a server a killed magpie left behind (its own session outlives the call): the report's pid,
# else the process serving our model on our port.
stop_leftover() {
  local run=$1 port=$2 pid
  pid=$(python3 -c "import json,sys; print((json.load(open(sys.argv[1])).get('server') or {}).get('pid') or '')" \
        "$WORK/$run/benchmark_report.json" 2>/dev/null)
  [ -z "$pid" ] && pid=$(ps -eo pid=,args= | awk -v m="$MODEL" -v p="$port" \
        'index($0, "serve " m) && index($0, "--port " p) {print $1; exit}')
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    say "stopping the leftover server of $run (pid $pid)"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  fi
}

# bench NAME PORT STEP_CAP ANALYSIS_S ARGS...: magpie's own --timeout ends the run (server stopped,
# report written) before the step's; ANALYSIS_S is left for what magpie does after it (trace analysis).
bench() {
  local name=$1 port=$2 step analysis=$4
  step=$(cap "$3")
  shift 4
  if (( step - analysis < 20 )); then
    say "$name run skipped: ${step} s left for it"
    return
  fi
  say "$name run (at most ${step} s)"
  timeout -k 10 "$step" python3 -m magpie benchmark transformers -m "$MODEL" -p "$PRECISION" \
    --extra-server-args "--device $DEVICE" --port "$port" --timeout "$(( step - analysis ))" \
    --ready-timeout 90 -o "$WORK/$name" "$@" > "$PACK/$name.txt" 2>&1
  say "$name run: exit $?"
  tail -12 "$PACK/$name.txt"
  stop_leftover "$name" "$port"
}

bench clean 8100 100 10 --num-prompts 16 --concurrency 4 --input-len 256 --output-len 64 --num-warmups 2
# Few short requests: a profiled decode step of this 8-layer model is a few thousand events (~1 MB of
# trace), and the trace must be exported, analysed and brought back within the budget.
bench profiled 8101 150 50 --num-prompts 4 --concurrency 2 --input-len 256 --output-len 16 --num-warmups 1 \
  --torch-profiler

# The report lacks the analysis only when magpie was stopped during it: analyse the traces on their own.
if ! python3 -c "import json,sys; sys.exit(not (json.load(open(sys.argv[1])).get('tracelens_analysis') or {}).get('outputs'))" \
     "$WORK/profiled/benchmark_report.json" 2>/dev/null && [ -d "$WORK/profiled/torch_trace" ]; then
  say "analysing the profiled run's traces on their own"
  timeout -k 5 "$(cap 60 15)" python3 -m magpie benchmark --trace-dir "$WORK/profiled/torch_trace" \
    --analysis-mode inference -o "$WORK/profiled_analysis" > "$PACK/profiled_analysis.txt" 2>&1
fi

say "packing"
for run in clean profiled; do
  mkdir -p "$PACK/$run"
  cp "$WORK/$run"/{benchmark_report.json,bench_serve_result.json,benchmark_config.json,trace_report.html} \
    "$PACK/$run/" 2>/dev/null
  [ -f "$WORK/$run/server.log" ] && tail -n 300 "$WORK/$run/server.log" > "$PACK/$run/server_tail.log"
done
(cd "$WORK" && find profiled/tracelens profiled/gap_analysis profiled/torch_trace profiled_analysis -type f \
  -printf '%s\t%p\n' 2>/dev/null | sort -k2) > "$PACK/trace_files.txt"
# The analysis's CSVs (small) travel too; the trace itself separately, compressed, when it is small.
(cd "$WORK" && timeout 30 tar -czf "$PACK/analysis.tar.gz" profiled/tracelens profiled/gap_analysis \
  profiled/gpu_timeline*.csv profiled_analysis 2>/dev/null)
rm -f "$OUT/profiled_trace.json.gz"
trace=$(ls -S "$WORK"/profiled/torch_trace/*.json 2>/dev/null | tail -1)
if [ -n "$trace" ]; then
  timeout 40 gzip -c -4 "$trace" > "$WORK/trace.json.gz" \
    && [ "$(stat -c %s "$WORK/trace.json.gz")" -lt 15000000 ] && cp "$WORK/trace.json.gz" "$OUT/profiled_trace.json.gz"
fi

timeout 30 python3 - "$WORK" "$PACK/env.txt" "$DEVICE" "$SIZE" > "$OUT/serving_summary.txt" 2>&1 <<'EOF'
import json, sys
from pathlib import Path

work, env, device, size = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
f = lambda v: f"{v:.2f}" if isinstance(v, float) else v
print(f"h200_serving: device={device} size={size}")
gpu = [l for l in env.read_text().splitlines() if l.startswith(("python ", "transformers "))] if env.exists() else []
print("env:", " | ".join(gpu))
model = work / "model" / "magpie_tiny_model.json"
if model.exists():
    print("model:", json.loads(model.read_text()))
for run in ("clean", "profiled"):
    path = work / run / "benchmark_report.json"
    if not path.exists():
        print(f"{run}: NO REPORT")
        continue
    r = json.loads(path.read_text())
    lat, thr, counts = r.get("latency") or {}, r.get("throughput") or {}, r.get("run") or {}
    med = lambda k: f((lat.get(k) or {}).get("median"))
    alloc = (r.get("provenance") or {}).get("gpu_allocation")
    mon = r.get("gpu_monitor") or {}
    mem = (mon.get("memory_used_mib") or {}).get("max")
    print(f"{run}: success={r['success']} run_kind={r['run_kind']} reward_eligible={r['reward_eligible']} "
          f"completed={counts.get('completed')} failed={counts.get('failed')} "
          f"out_tokens={counts.get('total_output_tokens')} duration_s={f(counts.get('duration_s'))}")
    print(f"  throughput req/s={f(thr.get('request_throughput'))} out tok/s={f(thr.get('output_throughput'))}  "
          f"median ms: ttft={med('ttft')} tpot={med('tpot')} itl={med('itl')} e2el={med('e2el')}")
    print(f"  gpu allocation={alloc} monitor: memory_used_mib max={f(mem)} "
          f"sm_clock max={f((mon.get('sm_clock_mhz') or {}).get('max'))} "
          f"power_w max={f((mon.get('power_w') or {}).get('max'))}"
          f"{'' if mon else ' reason=' + str(r.get('gpu_monitor_reason'))}")
    print(f"  server ready after {f((r.get('server') or {}).get('ready_after_s'))} s, engine "
          f"{(r.get('provenance') or {}).get('engine_version')}, execution {r.get('execution_time'):.1f} s")
    for e in r.get("errors") or []:
        lines = e.splitlines()      # a log tail's end says why
        print("  error:", "\n    ".join(lines[:1] + lines[1:][-6:])[:1200])
    if run == "profiled":
        t = r.get("tracelens_analysis") or {}
        g = r.get("gap_analysis") or {}
        print(f"  traces={len(g.get('traces') or [])} gpu_kernels={g.get('kernels')} kernel_time_us={g.get('total_kernel_time_us')}")
        print(f"  tracelens outputs={len(t.get('outputs') or [])} stages={ {trace: sorted(v) for trace, v in (t.get('per_stage') or {}).items()} } "
              f"picks={[p.get('method') for p in t.get('picks') or []]} errors={t.get('errors')}")
        for w in (t.get("warnings") or [])[:3]:
            print("  warning:", w[:300])
        for b in (r.get("top_bottlenecks") or [])[:5]:
            print("  top:", json.dumps(b, default=str)[:200])
alone = work / "profiled_analysis"
if alone.exists():
    print("trace analysis run on its own:", sum(1 for _ in alone.rglob("*.csv")), "CSV files")
EOF
if [ -n "$trace" ]; then
  echo "trace $(basename "$trace"): $(stat -c %s "$trace") bytes, gzip $(stat -c %s "$WORK/trace.json.gz" 2>/dev/null) bytes;" \
    "$([ -f "$OUT/profiled_trace.json.gz" ] && echo "in \$OUT/profiled_trace.json.gz" || echo "too large to bring back")" \
    >> "$OUT/serving_summary.txt"
fi
echo "elapsed $(( SECONDS - START )) s" >> "$OUT/serving_summary.txt"
cat "$OUT/serving_summary.txt"
cp "$OUT/serving_summary.txt" "$PACK/"
(cd "$WORK" && timeout 30 tar -czf "$OUT/serving.tar.gz" pack)
ls -la "$OUT"
say "done"
