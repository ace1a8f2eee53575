"""Environments: tasks with stable ids, deterministic splits, sandbox episodes, host-side grading.

Every environment, built-in or not, is a plugin named by a reference:

    gsm8k, dbbench, jsonl, tau2-mock, tau2-retail, tau2-airline   built-in names
    NAME                              an entry point in the group `ecdysis.environments`
    package.module:factory            any importable factory (the config's folder and the
                                      working directory are on the import path)

`factory(data_dir=..., seed=..., **env.options)` returns the host-side `Environment`; the sandbox
imports the same module and calls its `make_episode(public, options)`. See `envs/base.py`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

from .base import DataNotFoundError, Environment, Episode, Score, Task, TaskFileError, seeded_order

ENTRY_POINT_GROUP = "ecdysis.environments"
BUILTIN: dict[str, str] = {
    "gsm8k": "ecdysis.envs.gsm8k:GSM8K",
    "dbbench": "ecdysis.envs.dbbench:DBBench",
    "jsonl": "ecdysis.envs.jsonl_suite:from_options",
    "tau2-mock": "ecdysis.envs.tau2_bench:mock",
    "tau2-retail": "ecdysis.envs.tau2_bench:retail",
    "tau2-airline": "ecdysis.envs.tau2_bench:airline",
}
ENVIRONMENTS = tuple(BUILTIN)


class UnknownEnvironmentError(ValueError):
    pass


def resolve(name: str) -> str:
    """The `module:attr` reference for an environment name. Raises UnknownEnvironmentError."""
    if name in BUILTIN:
        return BUILTIN[name]
    from importlib.metadata import entry_points  # only for non-built-in names (the sandbox worker skips it)

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.value
    if ":" in name and all(name.partition(":")[::2]):
        return name
    raise UnknownEnvironmentError(
        f"unknown environment {name!r}; use a built-in name ({', '.join(BUILTIN)}), an entry point of the "
        f"group {ENTRY_POINT_GROUP!r}, or a factory reference 'package.module:factory'")


def import_module(name: str, search: list[Path] | None = None) -> Any:
    """Import the module behind an environment reference, with `search` folders on the import path."""
    module_name = resolve(name).partition(":")[0]
    for folder in reversed(search or []):  # the configured plugin folders first, in their order
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))
    _forget_if_elsewhere(module_name, search or [])
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if module_name.startswith("ecdysis.") or exc.name != module_name:
            raise
        looked = ", ".join(str(f) for f in search or []) or "the Python path"
        raise UnknownEnvironmentError(
            f"environment {name!r}: cannot import module {module_name!r} (looked in {looked} and the "
            "installed packages). Put it next to your config or in the working directory, or install it.") from exc


def _forget_if_elsewhere(module_name: str, search: list[Path]) -> None:
    """Drop an already imported plugin module that came from another folder than the one `search` finds it in
    (or from a folder that is gone), so a second workspace in the same process imports its own plugin."""
    top = module_name.split(".")[0]
    loaded = getattr(sys.modules.get(top), "__file__", None)
    if not loaded or top == "ecdysis":
        return
    for folder in search:
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"):
            if candidate.exists():
                if not Path(loaded).exists() or candidate.resolve() != Path(loaded).resolve():
                    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
                        del sys.modules[name]
                    importlib.invalidate_caches()
                return


def plugin_root(name: str, search: list[Path] | None = None) -> str | None:
    """The folder to put on the sandbox's import path for a plugin outside the installed packages."""
    module = import_module(name, search)
    if not getattr(module, "__file__", None) or resolve(name).startswith("ecdysis."):
        return None
    root = Path(module.__file__).resolve().parent
    for _ in range(module.__name__.count(".")):
        root = root.parent
    return str(root)


def get_environment(name: str, data_dir: Path | None = None, seed: int = 0, search: list[Path] | None = None,
                    **options: Any) -> Environment:
    """Host-side environment (task loading and grading)."""
    module = import_module(name, search)
    attr = resolve(name).partition(":")[2]
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UnknownEnvironmentError(f"environment {name!r}: {module.__name__} has no callable {attr!r}")
    params = inspect.signature(factory).parameters
    if "search" in params:
        options = {**options, "search": list(search or [])}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            known = [p for p in params if p not in ("data_dir", "seed", "search")]
            raise UnknownEnvironmentError(
                f"environment {name!r} has no option(s) {', '.join(f'env.options.{k}' for k in unknown)}; "
                f"its options: {', '.join(known) or 'none'}")
    return factory(data_dir=data_dir, seed=seed, **options)


def make_episode(name: str, public: dict[str, Any], options: dict[str, Any]) -> Episode:
    """Sandbox-side episode for one task's public view: the plugin module's `make_episode`."""
    module = import_module(name)
    if not hasattr(module, "make_episode"):
        raise UnknownEnvironmentError(f"environment {name!r}: module {module.__name__} defines no make_episode()")
    return module.make_episode(public, options)


__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "ENVIRONMENTS",
    "DataNotFoundError",
    "Environment",
    "Episode",
    "Score",
    "Task",
    "TaskFileError",
    "UnknownEnvironmentError",
    "get_environment",
    "make_episode",
    "plugin_root",
    "resolve",
    "seeded_order",
]
