"""Lengths in tokens (issue 40.1): prompts of the random dataset built as vLLM builds them (token ids, range ratio, a
shared prefix) and counted with the model's own tokenizer by default (`tokenizer` overrides it), lengths checked
against the model's context before any server starts, and a real `transformers serve` on the tiny model (one server
for the module) reporting the token counts asked for."""

import json
import os

import pytest

from magpie.serving.datasets import length_range, load_tokenizer, random_dataset
from magpie.serving.local import free_port
from magpie.serving.report import BenchmarkConfig, prompt_tokenizer
from magpie.serving.runner import REPORT, RESULT, SERVER_LOG, run_benchmark
from magpie.serving.tiny_model import train_tokenizer


def test_random_prompts_hold_their_token_counts_and_share_a_prefix():
    tokenizer = train_tokenizer()
    samples = random_dataset(24, 32, 8, range_ratio=0.25, prefix_len=12, seed=3, tokenizer=tokenizer)
    lo, hi = length_range(32, 0.25)
    for s in samples:
        assert len(tokenizer.encode(s.prompt, add_special_tokens=False)) == s.prompt_len
        assert 12 + lo <= s.prompt_len <= 12 + hi and 6 <= s.expected_output_len <= 10
    assert len({s.prompt_len for s in samples}) > 1  # the range ratio draws lengths
    shared = os.path.commonprefix([s.prompt for s in samples])
    prefix_ids = tokenizer.encode(shared, add_special_tokens=False)
    assert len(prefix_ids) >= 10  # the prefix, but for its last merge or two
    alone = random_dataset(24, 32, 8, seed=3, tokenizer=tokenizer)
    assert len(tokenizer.encode(os.path.commonprefix([s.prompt for s in alone]), add_special_tokens=False)) < 3


def test_lengths_beyond_the_context_are_one_line_before_a_server_starts(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    report = run_benchmark(
        BenchmarkConfig(
            framework="transformers",
            model=str(model),
            input_len=200,
            output_len=64,
            output_dir=str(tmp_path / "ws"),
            timeout_s=60,
        )
    )
    assert not report.success and report.server is None and not (tmp_path / "ws" / SERVER_LOG).exists()
    assert (
        len(report.errors) == 1
        and "do not fit the model's context of 256 (max_position_embeddings" in report.errors[0]
        and "264 tokens" in report.errors[0]
    )
    fits = BenchmarkConfig(framework="transformers", model=str(model), input_len=200, output_len=64, max_model_len=512)
    assert prompt_tokenizer(fits) is None  # it fits; no tokenizer files: words (the engine may object)
    (model / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer .*: none found"):
        prompt_tokenizer(fits)  # a broken tokenizer: one line before a server starts


def test_the_models_own_tokenizer_by_default_and_a_given_one_over_it(tiny_model, tmp_path):
    assert prompt_tokenizer(BenchmarkConfig(framework="transformers", model=str(tiny_model))) == str(tiny_model)
    other = tmp_path / "tok"
    train_tokenizer(vocab_size=300).save_pretrained(other)
    given = BenchmarkConfig(framework="transformers", model=str(tiny_model), tokenizer=str(other))
    assert prompt_tokenizer(given) == str(other) and load_tokenizer(str(other)).vocab_size == 300
    with pytest.raises(ValueError, match="tokenizer /nowhere: none found"):
        prompt_tokenizer(
            BenchmarkConfig(framework="vllm", model="m", base_url="http://127.0.0.1:9", tokenizer="/nowhere")
        )


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        report = run_benchmark(
            BenchmarkConfig(
                framework="transformers",
                model=str(tiny_model),
                port=free_port(),
                input_len=24,
                output_len=6,
                prefix_len=8,
                num_prompts=4,
                concurrency=2,
                timeout_s=240,
                output_dir=str(out),
            )
        )
    return report, out


def test_transformers_serve_is_sent_the_token_counts_asked_for(served, tiny_model):
    report, out = served
    assert report.success, report.errors
    assert report.config.tokenizer == str(tiny_model)
    # the server's own usage counts: each prompt 8 + 24 tokens, each output forced to 6
    assert report.throughput.total_input_tokens == 4 * (8 + 24)
    assert report.throughput.total_output_tokens == 4 * 6
    result = json.loads((out / RESULT).read_text())
    assert result["tokenizer_id"] == str(tiny_model) and result["total_input_tokens"] == 4 * 32
    assert json.loads((out / REPORT).read_text())["config"]["prefix_len"] == 8


def test_the_cli_takes_a_tokenizer_and_a_prefix(tmp_path, capsys):
    from magpie.cli import main
    from magpie.serving.stub_server import ThreadedStubServer

    folder = tmp_path / "tok"
    train_tokenizer().save_pretrained(folder)
    with ThreadedStubServer() as srv:
        argv = [
            "benchmark",
            "vllm",
            "-m",
            "tiny",
            "--base-url",
            srv.base_url,
            "--num-prompts",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "2",
            "--random-prefix-len",
            "4",
        ]
        assert main([*argv, "--tokenizer", str(folder), "-o", str(tmp_path / "a")]) == 0
        assert main([*argv, "--tokenizer", str(tmp_path / "none"), "-o", str(tmp_path / "b")]) == 1
    report = json.loads((tmp_path / "a" / REPORT).read_text())
    assert report["config"]["tokenizer"] == str(folder) and report["config"]["prefix_len"] == 4
    assert report["raw_result"]["tokenizer_id"] == str(folder)
    err = capsys.readouterr().err
    assert f"tokenizer {tmp_path / 'none'}: none found" in err
