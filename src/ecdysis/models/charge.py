"""Charged time: what a model call, an episode's sandbox or a replay costs, by a model, not by the clock.

Real wall time depends on what else the machine runs; charged time does not. A model call is charged

    call_s + fresh / prompt_tok_s + generated / gen_tok_s + constrained_s * constrained
           + prompt_ctx_s * fresh * (cached + fresh / 2) / 1e6 + gen_ctx_s * generated * (prompt + generated / 2) / 1e6

at the model's rates (fresh = prompt tokens - prefix-cached tokens; constrained = generated tokens under a
grammar, e.g. a role's JSON schema, each slower; the last two terms are attention over a growing context: a
1500-token role prompt costs more per token than a 100-token agent prompt). The rates live in
`rates.toml` beside this file, measured once per catalog model on an idle machine by
`benchmarks/measure_rates.py`; `$ECDYSIS_RATES` names a file whose entries are added or win. A model without an
entry (a hosted or HTTP endpoint) is charged the latency it was recorded with when it ran fresh. A call served
from the response cache is charged what it cost when it ran: the cache keeps the original usage and latency.
A sandboxed episode (live or a replay of stored replies) is charged `[sandbox] episode_s`.

Which calls a *run* pays is decided where runs are summed (`store.charged_calls`): a call the run already made
(the same request to the same model, whatever the cache scope) is free, as it would be in a cold run of that
arm alone; every other call is paid whether it ran now or came from another run's cache entry.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .base import ChatResponse
from .local_models import CATALOG

RATES_ENV = "ECDYSIS_RATES"


class RatesError(ValueError):
    """A rates file that cannot be read or has a bad entry; the message names the file and the entry."""


@dataclass(frozen=True)
class Rate:
    """One model's measured speed (one call at a time, as the embedded backend serves them). `prompt_ctx_s` and
    `gen_ctx_s`: seconds per million (token x context token) pairs, the cost of a longer context."""

    prompt_tok_s: float
    gen_tok_s: float
    call_s: float = 0.0
    measured: str = ""
    prompt_ctx_s: float = 0.0
    gen_ctx_s: float = 0.0
    constrained_s: float = 0.0  # extra seconds per token generated under a grammar

    def seconds(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, constrained: int = 0) -> float:
        fresh = max(prompt_tokens - cached_tokens, 0)
        cached = prompt_tokens - fresh
        return (self.call_s + fresh / self.prompt_tok_s + completion_tokens / self.gen_tok_s
                + self.constrained_s * min(constrained, completion_tokens)
                + self.prompt_ctx_s * fresh * (cached + fresh / 2) / 1e6
                + self.gen_ctx_s * completion_tokens * (prompt_tokens + completion_tokens / 2) / 1e6)


@dataclass(frozen=True)
class RateTable:
    """Rates per model (a catalog name, or a backend identity such as `openai-compat:URL::NAME`) and the
    sandbox's per-episode charge. `version` changes whenever a rate does (results name the table they used)."""

    version: str
    models: dict[str, Rate] = field(default_factory=dict)
    episode_s: float = 0.0

    def rate(self, identity: str) -> Rate | None:
        """The rate for a backend identity: exact, else the catalog model whose weights it is (llama.cpp:SHA)."""
        if identity in self.models:
            return self.models[identity]
        digest = identity.removeprefix("llama.cpp:")
        name = next((s.name for s in CATALOG.values() if s.sha256 == digest), None)
        return self.models.get(name) if name else None

    def call_seconds(self, response: ChatResponse) -> float:
        """What this call costs (`response` as the backend returned it, with its own latency)."""
        rate = self.rate(response.model_id)
        if rate is None:
            return max(response.latency_s, 0.0)
        u = response.usage
        return rate.seconds(u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.constrained_tokens)


def _positive(value: object, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise RatesError(f"{where}: {name} should be a number >= 0 (got {value!r})")
    return float(value)


def parse_rates(data: dict[str, object], where: str) -> RateTable:
    """A rate table from parsed TOML (`where` names the file in errors)."""
    models: dict[str, Rate] = {}
    entries = data.get("models", {})
    if not isinstance(entries, dict):
        raise RatesError(f"{where}: [models] should be a table of model tables")
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise RatesError(f"{where}: [models.{name!r}] should be a table")
        unknown = set(entry) - {"prompt_tok_s", "gen_tok_s", "call_s", "measured", "prompt_ctx_s", "gen_ctx_s",
                                "constrained_s"}
        if unknown:
            raise RatesError(f"{where}: [models.{name!r}] has unknown key(s) {sorted(unknown)}")
        prompt, gen = (_positive(entry.get(k), f"{where} [models.{name!r}]", k) for k in ("prompt_tok_s", "gen_tok_s"))
        if not prompt or not gen:
            raise RatesError(f"{where}: [models.{name!r}] needs prompt_tok_s and gen_tok_s > 0")
        here = f"{where} [models.{name!r}]"
        models[name] = Rate(prompt, gen, _positive(entry.get("call_s", 0.0), here, "call_s"),
                            str(entry.get("measured", "")), _positive(entry.get("prompt_ctx_s", 0.0), here,
                                                                      "prompt_ctx_s"),
                            _positive(entry.get("gen_ctx_s", 0.0), here, "gen_ctx_s"),
                            _positive(entry.get("constrained_s", 0.0), here, "constrained_s"))
    sandbox = data.get("sandbox", {})
    if not isinstance(sandbox, dict):
        raise RatesError(f"{where}: [sandbox] should be a table")
    return RateTable(str(data.get("version", "")), models,
                     _positive(sandbox.get("episode_s", 0.0), f"{where} [sandbox]", "episode_s"))


def _read(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RatesError(f"{path}: not a readable rates file ({exc}); see src/ecdysis/models/rates.toml for the "
                         f"format, or unset ${RATES_ENV}") from None


@lru_cache(maxsize=8)
def _load(extra: str) -> RateTable:
    builtin = parse_rates(tomllib.loads((resources.files("ecdysis.models") / "rates.toml").read_text()),
                          "ecdysis/models/rates.toml")
    if not extra:
        return builtin
    path = Path(extra).expanduser()
    user = parse_rates(_read(path), str(path))
    has_sandbox = "sandbox" in _read(path)
    # a file that sets the sandbox and every built-in model replaces the built-in table: its name alone, so
    # results charged under it pool across checkouts whose built-in tables differ
    whole = has_sandbox and set(builtin.models) <= set(user.models)
    return RateTable(f"{path.name}:{user.version}" if whole else f"{builtin.version}+{path.name}:{user.version}",
                     builtin.models | user.models, user.episode_s if has_sandbox else builtin.episode_s)


def rates() -> RateTable:
    """The rate table in force: the built-in one, with `$ECDYSIS_RATES`'s entries added (read once per path)."""
    return _load(os.environ.get(RATES_ENV, ""))
