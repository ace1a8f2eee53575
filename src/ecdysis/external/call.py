"""`python -m ecdysis.external.call module:function`: an agent given as a Python callable, run as a program.

The function is imported from the working directory (the config's folder) or installed packages and called
with the task's public view (a dict); it may be async. It returns the answer (a string), or a dict
`{"answer": ..., "state": {...}}`; that is written to `ECDYSIS_RESULT`. It reaches the model through
`OPENAI_BASE_URL` / `OPENAI_API_KEY` like any agent program (the OpenAI client reads them by itself).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m ecdysis.external.call module:function", file=sys.stderr)
        return 2
    module_name, _, function = argv[0].partition(":")
    sys.path.insert(0, os.getcwd())
    fn = getattr(importlib.import_module(module_name), function)
    task = json.loads(os.environ["ECDYSIS_TASK"])
    result = fn(task)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    out = result if isinstance(result, dict) else {"answer": None if result is None else str(result)}
    Path(os.environ["ECDYSIS_RESULT"]).write_text(json.dumps(out, default=str))
    return 0


async def _await(value: object) -> object:
    return await value  # type: ignore[misc]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
