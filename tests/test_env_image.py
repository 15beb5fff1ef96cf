"""The serving image holds the distributions a fresh interpreter of this environment imports, wherever this
process's `sys.path` has been pointed since it started (Ray, once imported, puts its vendored psutil first: an image
built after that held Ray's copy, in a folder the container's Python never searches, and failed to serve)."""

import sys

import pytest

from magpie.serving import env_image


def test_a_distribution_shadowing_an_installed_one_on_sys_path_is_not_taken(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    shadow = tmp_path / "tokenizers-0.0.0.dist-info"
    shadow.mkdir()
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 0.0.0\n")
    (shadow / "RECORD").write_text("tokenizers/__init__.py,,\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

    found = {d.metadata["Name"].lower(): d for d in env_image.distributions()}

    assert found["tokenizers"].version != "0.0.0"
    assert str(tmp_path) not in str(found["tokenizers"].locate_file("tokenizers"))


def test_the_search_path_is_a_fresh_interpreters(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    path = env_image.search_path()

    assert str(tmp_path) not in path
    assert any(p.endswith("site-packages") for p in path)
