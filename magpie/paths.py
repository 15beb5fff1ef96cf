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


def cache_root() -> Path:
    """magpie's folder of things made once and reused (compiler caches, compiled templates):
    out of code under test's reach (its sandbox shows no home folder)."""
    import os

    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "magpie"


def subprocess_env(base: dict | None = None) -> dict:
    """An environment in which `python -m magpie...` finds this magpie, installed or not, and
    which never carries the build's input secret (code under test reads its environment)."""
    import os

    from magpie.environment import INPUT_SECRET

    env = dict(os.environ if base is None else base)
    env.pop(INPUT_SECRET, None)
    parent = str(_PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, env.get("PYTHONPATH")) if p)
    return env


def python_module_command(module: str) -> list[str]:
    """`python -m module` without the working folder on the module path: magpie's own
    processes start in a project's folder, where code under test may have left a `magpie/`
    (or any module magpie imports) to be picked up first."""
    import sys

    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    return [
        sys.executable,
        "-c",
        "import runpy, sys; del sys.path[0], sys.argv[0]; "
        "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)",
        module,
    ]
