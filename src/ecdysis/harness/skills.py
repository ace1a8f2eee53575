"""H5 procedural skills: short tips retrieved per task with BM25 (rank_bm25), demonstrations, and labelled
training examples retrieved per task."""

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


def example_tokens(text: str) -> list[str]:
    """Words for example retrieval: ASCII words (stopwords ignored), every other letter on its own and the
    128-code-point range it lies in, so texts in scripts without ASCII words (or without spaces) match by the
    letters they share, and texts in one script match even when they share no letter."""
    letters = [ch for ch in text.lower() if ch.isalpha() and not ch.isascii()]
    return tokenize(text) + letters + [f"u{ord(ch) >> 7:x}" for ch in letters]


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


def parse_demos(text: str | None) -> list[dict[str, Any]]:
    """Demonstrations as message history. An item is {"user": ..., "assistant": ...} (one exchange) or
    {"messages": [...]} (a whole exchange as chat messages: assistant tool calls and tool results kept)."""
    if not text:
        return []
    data: Any = json.loads(text)
    items = data.get("demos", []) if isinstance(data, dict) else data
    messages: list[dict[str, Any]] = []
    for demo in items:
        if "messages" in demo:
            messages.extend(dict(m) for m in demo["messages"])
            continue
        messages.append({"role": "user", "content": str(demo["user"])})
        messages.append({"role": "assistant", "content": str(demo["assistant"])})
    return messages


@dataclass(frozen=True)
class ExampleSet:
    """H5 retrieved labelled demonstrations (`examples.json`): training tasks with their gold answers.

    `k` nearest to the task (by `retriever`, "bm25" over the prompt) are inserted as user/assistant
    exchanges, the answer written as `format` shows ("{answer}" is replaced). A task never retrieves
    itself (an example whose prompt equals the task's)."""

    k: int
    retriever: str
    format: str
    items: tuple[tuple[str, str], ...]  # (prompt, answer)


def parse_examples(text: str | None) -> ExampleSet | None:
    if not text:
        return None
    data: Any = json.loads(text)
    items = tuple((str(e["prompt"]), str(e["answer"])) for e in data.get("examples", []))
    return ExampleSet(int(data.get("k", 3)), str(data.get("retriever", "bm25")),
                      str(data.get("format", "Answer: {answer}")), items)


def nearest_examples(examples: ExampleSet, query: str) -> list[tuple[str, str]]:
    """The k examples nearest to `query` by BM25+ over prompt words (ties by file order), never the query itself."""
    pool = [e for e in examples.items if e[0].strip() != query.strip()]
    if not pool or examples.k <= 0:
        return []
    from rank_bm25 import BM25Plus

    docs = [example_tokens(p) or ["_"] for p, _ in pool]
    scores = BM25Plus(docs).get_scores(example_tokens(query))
    ranked = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
    return [pool[i] for i in ranked[:examples.k]]


def example_messages(text: str | None, query: str) -> list[dict[str, Any]]:
    """The retrieved examples for one task as message history (most similar last, next to the task)."""
    examples = parse_examples(text)
    if examples is None:
        return []
    out: list[dict[str, Any]] = []
    for prompt, gold in reversed(nearest_examples(examples, query)):
        out.append({"role": "user", "content": prompt})
        out.append({"role": "assistant", "content": examples.format.replace("{answer}", gold)})
    return out
