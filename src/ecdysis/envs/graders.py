"""Graders for your own single-turn tasks: built-in ones by name, or your function by reference.

A grader is `grade(answer: str | None, gold) -> float | bool` (1.0 / True = correct) and runs in the
host. One that cannot be called that way is refused when it is loaded; one that raises, or returns anything
but a number or a bool, is a grader error on that episode (scored 0 and counted apart from wrong answers:
`eval` exits 3). `env.options.grader` (or `--grader`) is one of:

    exact        the answer equals the gold text (case and surrounding space ignored)
    normalized   equal after lowercasing, dropping punctuation, articles and extra spaces
    numeric      both parse as numbers (commas, $ and % ignored) and differ by at most
                 `env.options.tolerance` relative (default 1e-6)
    choice       the multiple-choice letter: the first standalone A-J in the answer, or "(B)", "B)", "B."
    regex        the gold is a regular expression the whole answer must match (case-insensitive)
    contains     the normalized gold appears inside the normalized answer
    module:function          importable from the config's folder, the working directory or installed packages
    path/to/file.py:function a Python file (relative to the config's folder, else the working directory)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import string
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Grader = Callable[[str | None, Any], float | bool]
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


def normalize(text: Any) -> str:
    out = str(text).lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(_ARTICLES.sub(" ", out).split())


def to_number(text: Any) -> float | None:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    found = _NUMBER.findall(str(text).replace(",", "").replace("$", "").replace("%", ""))
    return float(found[-1]) if found else None


def exact(answer: str | None, gold: Any) -> bool:
    return answer is not None and answer.strip().lower() == str(gold).strip().lower()


def normalized(answer: str | None, gold: Any) -> bool:
    return answer is not None and normalize(answer) == normalize(gold)


def numeric(answer: str | None, gold: Any, tolerance: float = 1e-6) -> bool:
    a, g = to_number(answer) if answer is not None else None, to_number(gold)
    return a is not None and g is not None and abs(a - g) <= tolerance * max(1.0, abs(g))


def choice(answer: str | None, gold: Any) -> bool:
    if answer is None:
        return False
    found = re.search(r"(?<![A-Za-z])\(?([A-J])(?:\)|\.|:|(?![A-Za-z]))", answer.strip())
    return found is not None and found.group(1).upper() == str(gold).strip().strip("()").upper()


def regex(answer: str | None, gold: Any) -> bool:
    return answer is not None and re.fullmatch(str(gold), answer.strip(), re.IGNORECASE | re.DOTALL) is not None


def contains(answer: str | None, gold: Any) -> bool:
    return answer is not None and normalize(gold) in normalize(answer)


BUILTIN: dict[str, Grader] = {"exact": exact, "normalized": normalized, "numeric": numeric, "choice": choice,
                              "regex": regex, "contains": contains}


def grade_value(result: Any, ref: str) -> float:
    """A grader's result as a score: a bool or a finite number. Anything else raises TypeError saying so."""
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, (int, float)) and math.isfinite(result):
        return float(result)
    shown = repr(result) if len(repr(result)) <= 60 else repr(result)[:57] + "..."
    raise TypeError(f"grader {ref} returned {type(result).__name__} {shown}; a grader returns a number or a bool "
                    "(1.0 / True = correct)")


def check_tolerance(tolerance: Any) -> float | None:
    """`env.options.tolerance` as a float (None: the default); ValueError unless it is a number >= 0."""
    if tolerance is None:
        return None
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise ValueError(f"env.options.tolerance must be a number >= 0 (the numeric grader's relative tolerance, "
                         f"e.g. 1e-6), got {tolerance!r}")
    return float(tolerance)


def _check_callable(fn: Callable[..., Any], ref: str) -> None:
    """Refuse a grader that cannot be called as grade(answer, gold) or grade(answer, gold, state), naming its
    signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without introspectable signature: trust it
        return
    try:
        signature.bind(None, None)
    except TypeError:
        try:
            signature.bind(None, None, {})  # grade(answer, gold, state): docs/agents.md
            return
        except TypeError:
            pass
        raise ValueError(f"grader {ref!r}: {getattr(fn, '__name__', 'it')}{signature} cannot be called as "
                         "grade(answer, gold); a grader takes the answer (str or None) and the gold answer") from None


def load_grader(ref: str, search: list[Path] | None = None, tolerance: float | None = None) -> Grader:
    """A built-in grader by name, or a user function by `module:function` / `file.py:function`.
    Raises ValueError saying what is wrong and where it looked (also for a function that cannot be called as
    grade(answer, gold), or a tolerance that is not a number)."""
    tolerance = check_tolerance(tolerance)
    if ref in BUILTIN:
        if ref == "numeric" and tolerance is not None:
            return lambda answer, gold: numeric(answer, gold, tolerance)
        return BUILTIN[ref]
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"grader {ref!r}: use a built-in name ({', '.join(BUILTIN)}), 'module:function' "
                         "or 'path/to/file.py:function'")
    folders = [*(search or []), Path.cwd()]
    if target.endswith(".py"):
        candidates = [Path(target)] if Path(target).is_absolute() else [f / target for f in folders]
        path = next((c for c in candidates if c.exists()), None)
        if path is None:
            raise ValueError(f"grader {ref!r}: file {target} not found (looked in "
                             f"{', '.join(str(c.parent) for c in candidates)})")
        spec = importlib.util.spec_from_file_location(f"ecdysis_grader_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - any error in the user's file is reported with the file
            raise ValueError(f"grader {ref!r}: {path} failed to import: {type(exc).__name__}: {exc}") from exc
    else:
        for folder in folders:
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(f"grader {ref!r}: cannot import {target!r} ({exc}); looked in "
                             f"{', '.join(map(str, folders))} and the installed packages") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"grader {ref!r}: {target} has no function {attr!r}")
    _check_callable(fn, ref)
    return fn
