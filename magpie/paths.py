"""Where the built-in rules and templates live, in a checkout and in a wheel."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _resource_dir(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


def rules_dir() -> Path:
    return _resource_dir("rules")


def templates_dir() -> Path:
    return _resource_dir("templates")


def subprocess_env(base: dict | None = None) -> dict:
    """An environment in which `python -m magpie...` finds this magpie, installed or not."""
    import os

    env = dict(os.environ if base is None else base)
    parent = str(_PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, env.get("PYTHONPATH")) if p)
    return env
