"""What of an environment plugin's folder an episode sees: its importable code and its declared files.

A plugin's folder usually holds its data next to its module (the helpdesk example keeps `tasks.jsonl`,
with the gold of every split, beside `helpdesk_env.py`). The folder is therefore not bound into the
sandbox: only the Python files of the modules and packages the plugin module imports from that folder
(found by reading their import statements, so an import inside a function counts too), plus the files
the environment lists in `sandbox_files`. Paths it lists in `sandbox_hidden` are masked, declared or not.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SandboxView:
    """The host paths an episode sees besides the runtime (plain data: it keys a zygote, crosses to Ray).

    `import_paths`: folders put on the worker's import path (only what `read_only` binds exists there);
    `read_only`: files and folders bound read-only at their own path; `hidden`: masked with an empty file."""

    import_paths: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()


def _module_file(root: Path, name: str) -> Path | None:
    """The source of module `name` (dotted) under `root`: a .py file or a package's __init__.py."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return next(iter(sorted(base.parent.glob(f"{base.name}.*.so"))), None) if base.parent.is_dir() else None


def _imported_names(path: Path, module: str) -> set[str]:
    """Every module name `path` (the source of `module`) imports, relative imports resolved."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".") if package else []
            if node.level > 1:
                parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*(parts if node.level else []), *([node.module] if node.module else [])])
            if base:
                names.add(base)
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return names


def plugin_code(root: Path, module: str) -> list[str]:
    """The Python files under `root` that importing `module` can load: the module, its parent packages'
    `__init__.py`, and (transitively) every module of `root` it imports. Sorted absolute paths."""
    found: dict[str, Path] = {}
    queue = [module]
    while queue:
        name = queue.pop()
        for depth in range(1, name.count(".") + 2):  # a.b.c loads a, a.b and a.b.c
            prefix = ".".join(name.split(".")[:depth])
            if prefix in found:
                continue
            path = _module_file(root, prefix)
            if path is None:
                continue
            found[prefix] = path
            queue.extend(_imported_names(path, prefix))
    return sorted(str(p) for p in found.values())


def _declared(entries: Iterable[str], base: Path | None) -> list[str]:
    """`sandbox_files` entries as absolute paths; relative ones are relative to the plugin module's folder."""
    out = []
    for entry in entries:
        path = Path(entry)
        if not path.is_absolute():
            if base is None:
                raise ValueError(f"sandbox_files entry {entry!r} is relative, but the environment module is not "
                                 "imported from a plugin folder: give an absolute path")
            path = base / path
        if not path.exists():
            raise FileNotFoundError(f"sandbox_files entry {entry!r} does not exist (looked for {path})")
        out.append(str(path.absolute()))
    return out


@functools.lru_cache(maxsize=64)
def _view(module: str, roots: tuple[str, ...], files: tuple[str, ...], hidden: tuple[str, ...]) -> SandboxView:
    code: list[str] = []
    base: Path | None = None
    for root in roots:
        if (entry := _module_file(Path(root), module)) is not None:
            code, base = plugin_code(Path(root), module), entry.parent
            break
    return SandboxView(roots, tuple(dict.fromkeys([*code, *_declared(files, base)])), hidden)


def plugin_view(env_name: str, import_paths: Iterable[str] = (), files: Iterable[str] = (),
                hidden: Iterable[str] = ()) -> SandboxView:
    """What episodes of environment `env_name` see when its plugin module is imported from one of
    `import_paths`: that module's code closure in its folder, the declared `files` (the environment's
    `sandbox_files`) and, masked, `hidden` (its `sandbox_hidden`). Built-in environments add no code."""
    from ..envs import resolve

    module = resolve(env_name).partition(":")[0]
    roots = tuple(str(Path(p).resolve()) for p in import_paths)
    if module.startswith("ecdysis."):
        roots = ()
    return _view(module, roots, tuple(os.fspath(f) for f in files), tuple(os.fspath(h) for h in hidden))
