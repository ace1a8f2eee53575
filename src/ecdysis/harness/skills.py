"""H5 procedural skills: short tips retrieved per task with BM25 (rank_bm25), and demonstrations."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from has have how if in into is it its of on or so than that "
    "the their then there these this those to was were what when where which who why will with you your".split()
)


@dataclass(frozen=True)
class Skill:
    id: str
    trigger: str  # words describing when the tip applies; "*" means always
    tip: str


def tokenize(text: str) -> list[str]:
    return [w for w in TOKEN.findall(text.lower()) if w not in STOPWORDS]


def parse_skills(text: str | None) -> list[Skill]:
    if not text:
        return []
    data: Any = json.loads(text)
    items = data.get("skills", []) if isinstance(data, dict) else data
    return [Skill(str(s["id"]), str(s.get("trigger", "*")), str(s["tip"])) for s in items]


def retrieve(skills: list[Skill], query: str, top_k: int) -> list[Skill]:
    """Always-on skills first, then the top-k BM25+ matches of their triggers against the task text.

    A skill is a candidate only if its trigger shares a (non-stop) word with the task; the trigger says
    when the tip applies, so the tip's own words do not pull it into unrelated tasks. BM25+ keeps idf
    positive on the tiny corpora harnesses have (Okapi's is 0 with two documents).
    """
    always = [s for s in skills if s.trigger.strip() == "*"]
    rest = [s for s in skills if s.trigger.strip() != "*"]
    if not rest or top_k <= 0:
        return always
    from rank_bm25 import BM25Plus

    docs = [tokenize(s.trigger) or ["_"] for s in rest]
    words = tokenize(query)
    scores = BM25Plus(docs).get_scores(words)
    vocabulary = set(words)
    ranked = sorted((i for i in range(len(rest)) if vocabulary & set(docs[i])), key=lambda i: (-scores[i], i))
    return always + [rest[i] for i in ranked[:top_k]]


def parse_demos(text: str | None) -> list[dict[str, str]]:
    """Demonstrations as alternating user/assistant messages: [{"user": ..., "assistant": ...}]."""
    if not text:
        return []
    data: Any = json.loads(text)
    items = data.get("demos", []) if isinstance(data, dict) else data
    messages: list[dict[str, str]] = []
    for demo in items:
        messages.append({"role": "user", "content": str(demo["user"])})
        messages.append({"role": "assistant", "content": str(demo["assistant"])})
    return messages
