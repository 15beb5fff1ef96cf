"""Capture small, real PyTorch profiler traces on a GPU, as fixtures for the trace analysis.

- llama_decode: a small Llama-style model (random weights, bf16) generating tokens with a
  KV cache, a prefill step and decode steps, each under a `step` annotation;
- triton_custom: a model step that calls a custom Triton kernel;
- train_step: one forward/backward/optimizer step of a small MLP in bf16 autocast;
- serving_steps_vllm_format: the same model served in engine-like steps (prefill-only,
  decode-only and mixed steps of a few requests), each step under an annotation in vLLM's
  format `execute_context_N(T)_generation_M(G)`, written by this script (not by vLLM);
- llama_unannotated: a prefill and decode steps with no annotation at all, for the stage
  split from the call tree's repeating structure;
- conv_bf16: 2-d, grouped, transposed and 1-d convolutions of a small conv net;
- fp8_scaled_mm: torch._scaled_mm on float8_e4m3fn operands (row-wise and tensor-wise scales);
- graph_replay: an MLP captured as a CUDA graph and replayed as decode steps (vLLM-format
  annotations written by this script), so kernels come from cudaGraphLaunch;
- op_coverage: the ops TraceLens models beyond the other captures, forward and backward: cumsum and
  cumprod, sort and topk, bool masks (masked_fill, where, boolean indexing), embedding, layer, group,
  batch and instance norms, softmax and log-softmax (and their backward), logsumexp and norms,
  convolutions, max and average pooling, replication padding and nearest upsampling (fp32 and bf16);
- compare_repeats: six captures of one Triton workload (`repeat_<i>`) and three with one kernel made
  10% slower by a code change (an eleventh 32 MiB slice read from HBM where the others read ten,
  `slower_<i>`), for the comparison's false-positive rate and power (`--compare-traces`);
- tp2_collectives: two ranks, one process per GPU (NCCL), each running steps of a
  tensor-parallel MLP block (all_gather, matmuls, all_reduce, reduce_scatter in bf16), one
  trace per rank; with fewer than two GPUs the same program on the CPU with gloo, to check
  its structure.
Usage: python bench/capture_traces.py OUT_DIR [capture,capture...]
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile, record_function


def _save(prof, out: Path, name: str) -> None:
    raw = out / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out / f"{name}.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def llama_decode(out: Path) -> None:
    model = _small_llama()
    prompt = torch.randint(0, 8192, (4, 96), device="cuda")
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=False
        ) as prof:
            past, ids = None, prompt
            for step in range(17):
                stage = "prefill" if step == 0 else "decode"
                with record_function(f"step_{step}_{stage}"):
                    result = model(input_ids=ids, past_key_values=past, use_cache=True)
                    past = result.past_key_values
                    ids = result.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
    _save(prof, out, "llama_decode_bf16")


def _small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def serving_steps(out: Path) -> None:
    """Requests arrive while others decode: steps are prefill-only, decode-only or mixed (a
    new request's prefill beside the running requests' decodes, here two forwards in one step)."""
    model = _small_llama()
    running: list[tuple] = []  # (past, next ids)
    arrivals = {0: 2, 5: 1, 11: 1}  # step -> new requests of 64 prompt tokens
    with torch.no_grad():
        model(input_ids=torch.randint(0, 8192, (1, 64), device="cuda"))  # warm-up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for step in range(18):
                new = arrivals.get(step, 0)
                name = f"execute_context_{new}({64 * new})_generation_{len(running)}({len(running)})"
                with record_function(name):
                    decoded = []
                    for past, ids in running:
                        result = model(input_ids=ids, past_key_values=past, use_cache=True)
                        decoded.append((result.past_key_values, result.logits[:, -1:].argmax(-1)))
                    if new:
                        prompt = torch.randint(0, 8192, (new, 64), device="cuda")
                        result = model(input_ids=prompt, use_cache=True)
                        decoded.append((result.past_key_values, result.logits[:, -1:].argmax(-1)))
                    running = decoded
            torch.cuda.synchronize()
    _save(prof, out, "serving_steps_vllm_format")


def llama_unannotated(out: Path) -> None:
    model = _small_llama()
    prompt = torch.randint(0, 8192, (4, 80), device="cuda")
    with torch.no_grad():
        model(input_ids=prompt, use_cache=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            past, ids = None, prompt
            for _ in range(13):
                result = model(input_ids=ids, past_key_values=past, use_cache=True)
                past, ids = result.past_key_values, result.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
    _save(prof, out, "llama_unannotated")


def conv_net(out: Path) -> None:
    torch.manual_seed(0)
    net = (
        torch.nn.Sequential(
            torch.nn.Conv2d(32, 64, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, padding=1, groups=8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 1, stride=2),
            torch.nn.ConvTranspose2d(128, 32, 4, stride=2, padding=1),
        )
        .to("cuda", torch.bfloat16)
        .to(memory_format=torch.channels_last)
    )
    conv1d = torch.nn.Conv1d(64, 64, 5, padding=2).to("cuda", torch.bfloat16)
    x = torch.randn(8, 32, 56, 56, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    seq = torch.randn(8, 64, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        net(x), conv1d(seq)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for i in range(3):
                with record_function(f"iteration_{i}"):
                    net(x)
                    conv1d(seq)
            torch.cuda.synchronize()
    _save(prof, out, "conv_bf16")


def fp8_scaled_mm(out: Path) -> None:
    torch.manual_seed(0)
    shapes = [(2048, 4096, 4096), (64, 8192, 4096)]
    operands = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        operands.append(
            (a, b, torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda"), torch.tensor(1.0, device="cuda"))
        )

    def run():
        for a, b, row_scale, col_scale, one in operands:
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            torch._scaled_mm(a, b, scale_a=row_scale, scale_b=col_scale, out_dtype=torch.bfloat16)

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for i in range(3):
            with record_function(f"iteration_{i}"):
                run()
        torch.cuda.synchronize()
    _save(prof, out, "fp8_scaled_mm")


def graph_replay(out: Path) -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    mlp = mlp.to("cuda", torch.bfloat16)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                mlp(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mlp(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            with record_function("execute_context_1(8)_generation_0(0)"):
                mlp(x)  # an eager prefill-like step
            for _ in range(6):
                with record_function("execute_context_0(0)_generation_8(8)"):
                    graph.replay()
            torch.cuda.synchronize()
    _save(prof, out, "graph_replay")


@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x / rms * w).to(y_ptr.dtype.element_ty), mask=mask)


def triton_rmsnorm(x, w, eps=1e-6):
    y = torch.empty_like(x)
    _rms_kernel[(x.shape[0],)](x, w, y, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def triton_custom(out: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    proj = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.relu(triton_rmsnorm(x, w) @ proj)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for i in range(5):
            with record_function(f"iteration_{i}"):
                torch.relu(triton_rmsnorm(x, w) @ proj).sum()
        torch.cuda.synchronize()
    _save(prof, out, "triton_rmsnorm_matmul")


def train_step(out: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.LayerNorm(4096), torch.nn.Linear(4096, 1024)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(512, 1024, device="cuda")
    target = torch.randn(512, 1024, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        with record_function("train_step"):
            step()
        torch.cuda.synchronize()
    _save(prof, out, "train_step_mlp")


def op_coverage(out: Path) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=4),
        torch.nn.GroupNorm(4, 16),
        torch.nn.AvgPool2d(2),
        torch.nn.InstanceNorm2d(16, affine=True),
        torch.nn.AdaptiveAvgPool2d(1),
    ).cuda()
    embedding = torch.nn.Embedding(1000, 256).cuda()
    norm = torch.nn.LayerNorm(256).cuda()
    images = torch.randn(4, 8, 32, 32, device="cuda", requires_grad=True)
    tokens = torch.randint(0, 1000, (8, 64), device="cuda")

    def step(dtype):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            pooled = conv(images).flatten(1)
            hidden = norm(embedding(tokens))
            scores = hidden @ hidden.transpose(1, 2)
            mask = tokens[:, None, :] == 0  # bool
            scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1)
            logp = torch.log_softmax(scores.float(), dim=-1)
            kept = torch.where(probs > 0.01, probs, torch.zeros_like(probs))
            picked = hidden[hidden.sum(-1) > 0]  # boolean indexing
            values, _ = torch.sort(hidden, dim=-1)
            top, _ = torch.topk(hidden, 8, dim=-1)
            scan = torch.cumsum(hidden, dim=1) + torch.cumprod(torch.sigmoid(hidden), dim=-1)
            reduced = (
                torch.logsumexp(scores.float(), dim=-1).sum()
                + torch.linalg.norm(hidden.float(), dim=-1).sum()
                + values.mean()
                + top.amax()
                + scan.mean()
                + picked.sum()
                + kept.sum()
                + logp.mean()
            )
            padded = torch.nn.functional.pad(images, (1, 2, 3, 4), mode="replicate")
            upsampled = torch.nn.functional.interpolate(images, size=(64, 64), mode="nearest")  # the size recorded
            loss = reduced + pooled.sum() + padded.mean() + upsampled.mean()
        loss.backward()

    for dtype in (torch.float32, torch.bfloat16):
        step(dtype)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for dtype in (torch.float32, torch.bfloat16):
            with record_function(f"step_{str(dtype).split('.')[-1]}"):
                step(dtype)
        torch.cuda.synchronize()
    _save(prof, out, "op_coverage")


@triton.jit
def _passes_kernel(x_ptr, sums_ptr, slice_len, PASSES: tl.constexpr, BLOCK: tl.constexpr):
    """Sums one block of `PASSES` slices of `x`, each pass reading its own slice: no two loads share an
    address, so none can be merged by the compiler or served from L2, and each pass costs a slice's
    read from HBM."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < slice_len
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for slice_index in tl.static_range(PASSES):
        # evict-first: the stream passes through L2 without pushing out the model's weights
        acc += tl.load(x_ptr + slice_index * slice_len + offsets, mask=mask, other=0.0, eviction_policy="evict_first")
    # one sum per block: the writes are 1/BLOCK of a pass, the time is the passes' reads
    tl.store(sums_ptr + tl.program_id(0), tl.sum(acc, axis=0))


PASSES_REPEATED, PASSES_SLOWER = 10, 11
# 32 MiB of fp32 a pass: the ten passes' 320 MiB stream through the H200's L2 (50-60 MiB) and each
# call's first slices are long evicted when the next call reads them, so every pass is an HBM read,
# about 7-8 us at 4.3-4.8 TB/s: the eleventh pass adds 10% to the ten passes' ~75 us
SLICE_LEN = 1 << 23
PASSES_BLOCK = 1024


def run_passes(slices: torch.Tensor, sums: torch.Tensor, passes: int, block: int = PASSES_BLOCK) -> None:
    """`_passes_kernel` over the first `passes` rows of `slices` (one row a slice)."""
    slice_len = slices.shape[1]
    _passes_kernel[(triton.cdiv(slice_len, block),)](slices, sums, slice_len, PASSES=passes, BLOCK=block)


def compare_repeats(out: Path) -> None:
    """Repeats of one workload, each its own profiler session, and repeats with `_passes_kernel`
    reading 11 slices of its data instead of 10 (10% more HBM traffic, about 10% slower; nothing
    else changes)."""
    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(
            torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048), torch.nn.Linear(2048, 1024)
        )
        .cuda()
        .to(torch.bfloat16)
    )
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    slices = torch.randn(PASSES_SLOWER, SLICE_LEN, device="cuda")
    sums = torch.empty(triton.cdiv(SLICE_LEN, PASSES_BLOCK), device="cuda")

    def workload(passes):
        with torch.no_grad():
            for i in range(8):
                with record_function(f"iteration_{i}"):
                    y = torch.softmax(model(x).float(), dim=-1).sum()
                    run_passes(slices, sums, passes)
                    y + sums[:1].sum()

    for passes in (PASSES_REPEATED, PASSES_SLOWER):
        workload(passes)  # compile and warm up both variants
    torch.cuda.synchronize()
    folder = out / "compare_repeats"
    folder.mkdir(exist_ok=True)
    # a slower capture after every second repeat: a drift of the card's clocks over the run reaches both kinds
    order = [("repeat", PASSES_REPEATED, i) for i in range(6)]
    for i in range(3):
        order.insert(3 * i + 2, ("slower", PASSES_SLOWER, i))
    for name, passes, i in order:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            workload(passes)
            torch.cuda.synchronize()
        _save(prof, folder, f"{name}_{i}")
        durations = _kernel_durations(folder / f"{name}_{i}.json.gz", "_passes_kernel")
        mean = sum(durations) / len(durations) if durations else float("nan")
        print(f"{name}_{i}: _passes_kernel {len(durations)} calls, mean {mean:.1f} us")


def _kernel_durations(trace: Path, kernel: str) -> list[float]:
    """The durations (µs) of one kernel's calls in a saved trace: the capture checked where it is made."""
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    return [e["dur"] for e in events if e.get("cat") == "kernel" and e.get("name") == kernel]


# NVLink multicast (NVLS) must stay off on the shared multi-GPU host; spawned ranks inherit these
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def tp2_collectives(out: Path) -> None:
    world = 2
    backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    os.environ.update(MULTICAST_OFF)
    with tempfile.TemporaryDirectory() as scratch:
        # a file store: no port to pick, none taken by another job on the host
        torch.multiprocessing.spawn(_tp2_rank, args=(world, backend, Path(scratch) / "store", out), nprocs=world)


def _tp2_rank(rank: int, world: int, backend: str, store: Path, out: Path) -> None:
    """One rank of a Megatron-style MLP block with sequence parallelism: the sequence shards
    gathered, an up projection split by columns, a down projection split by rows (its partial
    sums all-reduced while a gate is computed), the gated sums reduce-scattered back to sequence
    shards."""
    gpu = backend == "nccl"
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
        device_id=device if gpu else None,
    )
    # the CPU stand-in is smaller: the same calls, in seconds on two cores
    tokens, hidden, ffn = (1024, 4096, 16384) if gpu else (64, 256, 1024)
    torch.manual_seed(rank)
    options = {"device": device, "dtype": torch.bfloat16}
    w_up = torch.randn(hidden, ffn // world, **options) / hidden**0.5
    w_down = torch.randn(ffn // world, hidden, **options) / ffn**0.5
    w_gate = torch.randn(hidden, hidden, **options) / hidden**0.5
    shard = torch.randn(tokens // world, hidden, **options)
    full = torch.empty(tokens, hidden, **options)

    def step(shard):
        # all_gather_into_tensor and reduce_scatter_tensor: the names the GPU host's torch (2.11) has
        dist.all_gather_into_tensor(full, shard)
        partial = torch.nn.functional.gelu(full @ w_up) @ w_down
        reducing = dist.all_reduce(partial, async_op=True)
        # work the reduction runs beside, so that the timeline's exposed communication is less than all of it
        gate = torch.sigmoid(full @ w_gate)
        reducing.wait()
        reduced = torch.empty_like(shard)
        dist.reduce_scatter_tensor(reduced, partial * gate)
        return reduced / reduced.norm()

    def sync():
        if gpu:
            torch.cuda.synchronize()

    with torch.no_grad():
        for _ in range(2):  # communicators and GEMM plans set up outside the trace
            shard = step(shard)
        sync()
        dist.barrier()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=activities, record_shapes=True) as prof:
            # each rank's trace says that it ran with multicast off
            prof.add_metadata_json("multicast_off", json.dumps({k: os.environ.get(k) for k in MULTICAST_OFF}))
            for i in range(4):
                with record_function(f"step_{i}"):
                    shard = step(shard)
            sync()
    _save(prof, out, f"{backend}_tp2_rank{rank}")
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    chosen = set(argv[1].split(",")) if len(argv) > 1 else None
    captures = (
        llama_decode,
        triton_custom,
        train_step,
        serving_steps,
        llama_unannotated,
        conv_net,
        fp8_scaled_mm,
        graph_replay,
        op_coverage,
        compare_repeats,
        tp2_collectives,
    )
    done = []
    for capture in captures:
        if chosen and capture.__name__ not in chosen:
            continue
        try:
            capture(out)
            done.append(capture.__name__)
        except Exception as err:  # keep the others
            print(f"{capture.__name__} failed: {type(err).__name__}: {err}")
    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "captures": done,
    }
    (out / "capture_info.json").write_text(json.dumps(info))
    for path in sorted(out.rglob("*")):
        if path.is_file():
            print(path.relative_to(out), path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
