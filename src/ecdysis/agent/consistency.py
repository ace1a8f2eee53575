"""Self-consistency (`generation.samples = n`): on a turn whose reply is a final answer, n - 1 more replies
are sampled (at `generation.sample_temperature`, each with its own sample index) and the answer most of
them give wins; the first reply giving it is kept. Costs up to n x the agent's tokens on answer turns.

Only the chosen reply stays in the replay record: the other samples' model events are marked `unchosen`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..harness.api import Reply
from .realize import Realized


def normal(answer: str) -> str:
    """An answer as votes are counted: case, surrounding punctuation and spaces ignored."""
    return re.sub(r"\s+", " ", answer.strip().strip(".*`'\" ").lower())


def answer_of(realized: Realized) -> str | None:
    found = next((a for a in realized.actions if a.is_answer), None) if realized.reject is None else None
    return None if found is None else found.input


def vote(session: Any, messages: list[dict[str, Any]], first: Reply, realized: Realized, samples: int,
         temperature: float, realize: Callable[[Reply], Realized]) -> tuple[Reply, Realized]:
    """Sample `samples - 1` more replies to the same messages and return the (reply, realized) of the majority
    answer (ties go to the earliest answer). Records a `vote` event."""
    base = int(session.params.get("sample_index", 0)) * samples
    first_event = len(session.traj.events) - 1
    candidates: list[tuple[Reply, Realized, int]] = [(first, realized, first_event)]
    for i in range(1, samples):
        reply = session.chat(list(messages), temperature=temperature, sample_index=base + i)
        candidates.append((reply, realize(reply), len(session.traj.events) - 1))
    answers = [answer_of(r) for _, r, _ in candidates]
    counts = Counter(normal(a) for a in answers if a is not None)
    winner = max(counts, key=lambda a: (counts[a], -[normal(x) if x else None for x in answers].index(a)))
    chosen = next(i for i, a in enumerate(answers) if a is not None and normal(a) == winner)
    for i, (_, _, event) in enumerate(candidates):
        if i != chosen:
            session.traj.events[event]["unchosen"] = True
    session.traj.add("vote", session.turn, answers=answers, chosen=chosen, votes=counts[winner])
    reply, result, _ = candidates[chosen]
    return reply, result
