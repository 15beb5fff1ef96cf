import json
from pathlib import Path
from types import SimpleNamespace

from magpie.cli import gpu_info

FIXTURE = Path(__file__).parent / "fixtures" / "h200" / "gpu_info.json"


def test_the_vendor_is_named_once(monkeypatch, capsys):
    """nvidia-smi's name is "NVIDIA H200" already: the line read "NVIDIA NVIDIA H200"."""
    monkeypatch.setattr(gpu_info, "collect", lambda: json.loads(FIXTURE.read_text()))
    assert gpu_info.run(SimpleNamespace(json=False)) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("GPU 0: NVIDIA H200 (sm_90), 143155 MiB, driver 580.159.04")
    assert "NVIDIA NVIDIA" not in first


def test_gpu_labels():
    assert gpu_info.gpu_label({"vendor": "NVIDIA", "name": "NVIDIA H200"}) == "NVIDIA H200"
    assert gpu_info.gpu_label({"vendor": "NVIDIA", "name": "Tesla T4"}) == "NVIDIA Tesla T4"
    assert gpu_info.gpu_label({"vendor": "AMD", "name": "AMD Instinct MI300X"}) == "AMD Instinct MI300X"
    assert gpu_info.gpu_label({"vendor": "AMD", "name": "gfx942"}) == "AMD gfx942"
    assert gpu_info.gpu_label({"name": "H200"}) == "H200"
