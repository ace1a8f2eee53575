"""The order a per-failure method takes its targets in.

Not the failures' id order: ids often name a task family (`family-i`), and sorted ids would make the
per-failure search fix one family at a time. The order is pseudo-random, fixed by the run seed and the
evaluation the failures come from, so a resumed run takes the same targets and another seed other ones.
"""

from __future__ import annotations

import hashlib


def target_order(failing: list[str], seed: int, step: str) -> list[str]:
    """`failing` (task ids) in the seeded order of run seed `seed` and the evaluation `step` they come from."""
    return sorted(failing, key=lambda t: hashlib.sha256(f"{seed}:{step}:{t}".encode()).hexdigest())
