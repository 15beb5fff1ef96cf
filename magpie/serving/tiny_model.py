"""A small random-weight Llama-style model and a locally trained tokenizer, built with no download.

It is what a real engine serves in the tests (and, larger, on a GPU): `build(path)` trains a
byte-level BPE tokenizer with `tokenizers` on words of the load client's built-in vocabulary,
initialises a `LlamaForCausalLM` from a seed, and saves both (safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json) so `transformers serve PATH` or any engine that
reads a Hugging Face folder can load it offline. The weights are random: the text is nonsense,
the timings are real. Greedy decoding is the default so runs repeat.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from magpie.serving.datasets import vocabulary

SPECIAL = ("<unk>", "<s>", "</s>")


def train_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on text of the built-in vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    words = vocabulary()
    corpus = [" ".join(rng.choices(words, k=64)) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        model_max_length=4096,
    )


def build(
    path: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 512,
    max_positions: int = 2048,
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Writes the model folder at `path` and returns it."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size, seed)
    # A chat template of our own: the user's text after a role word, so the chat endpoint works too.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig(
        do_sample=False,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "magpie_tiny_model.json").write_text(
        json.dumps(
            {
                "hidden_size": hidden_size,
                "layers": layers,
                "heads": heads,
                "kv_heads": kv_heads,
                "intermediate_size": intermediate_size,
                "vocab_size": len(tokenizer),
                "seed": seed,
                "dtype": dtype,
            },
            indent=1,
        )
        + "\n"
    )
    return path


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(
        description="build a random-weight Llama-style model with a locally trained tokenizer, offline"
    )
    p.add_argument("path")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(
        build(
            a.path,
            hidden_size=a.hidden_size,
            layers=a.layers,
            heads=a.heads,
            kv_heads=a.kv_heads,
            intermediate_size=a.intermediate_size,
            vocab_size=a.vocab_size,
            dtype=a.dtype,
            seed=a.seed,
        )
    )


if __name__ == "__main__":
    main()
