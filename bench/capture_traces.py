"""Capture small, real PyTorch profiler traces on a GPU, as fixtures for the trace analysis.

- llama_decode: a small Llama-style model (random weights, bf16) generating tokens with a
  KV cache, a prefill step and decode steps, each under a `step` annotation;
- triton_custom: a model step that calls a custom Triton kernel;
- train_step: one forward/backward/optimizer step of a small MLP in bf16 autocast.
Usage: python bench/capture_traces.py OUT_DIR
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import torch
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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(0, 8192, (4, 96), device="cuda")
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     with_stack=False) as prof:
            past, ids = None, prompt
            for step in range(17):
                stage = "prefill" if step == 0 else "decode"
                with record_function(f"step_{step}_{stage}"):
                    result = model(input_ids=ids, past_key_values=past, use_cache=True)
                    past = result.past_key_values
                    ids = result.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
    _save(prof, out, "llama_decode_bf16")


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
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.LayerNorm(4096),
                                torch.nn.Linear(4096, 1024)).cuda()
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


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for capture in (llama_decode, triton_custom, train_step):
        try:
            capture(out)
        except Exception as err:  # keep the others
            print(f"{capture.__name__} failed: {type(err).__name__}: {err}")
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    (out / "capture_info.json").write_text(json.dumps(info))
    for path in sorted(out.iterdir()):
        print(path.name, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
