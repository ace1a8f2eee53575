"""The typed configuration root, read from TOML with `section.key=value` overrides.

Secrets never live here: a model's API key is read from the environment variable its settings
name (`api_key_env`).
"""

from __future__ import annotations

import difflib
import shlex
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator

from .config_errors import ConfigError, config_error, dotted, key_parts, line_of, problem, should_be
from .models.local_models import DEFAULT_LOCAL_MODEL
from .models.registry import ModelSettings

DEFAULT_MODEL = f"local:{DEFAULT_LOCAL_MODEL}"


def _task_limit(value: Any) -> Any:
    """A number of tasks: a whole number >= 1, or "all" (None) for every task of the split."""
    if value is None or value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError('should be a whole number of tasks >= 1, or "all" for every task')
    return value


# A split's task count; TOML has no null, so "every task" is written "all" (never 0, which is refused).
TaskLimit = Annotated[int | None, BeforeValidator(_task_limit)]


def _holdout_limit(value: Any) -> Any:
    """The final-selection check's task count: "auto", or a whole number >= 0 (0: no check)."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError('should be "auto" or a whole number of tasks >= 0 (0: no final-selection check)')
    return value


HoldoutLimit = Annotated[int | str, BeforeValidator(_holdout_limit)]
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(gt=0)]
Temperature = Annotated[float, Field(ge=0, le=2)]
Fraction = Annotated[float, Field(ge=0, le=1)]


# run settings that change where and how fast episodes run, never their results (kept out of run ids)
EXECUTION_ONLY = ("progress", "executor", "ray_address", "episode_retries")


class RunSection(BaseModel):
    run_dir: Path = Path("runs/default")
    seed: int = 0
    concurrency: Positive = 2
    progress: bool = True
    max_agent_tokens: Positive | None = None  # budget for fresh (uncached) agent tokens; then no new episodes start
    executor: Literal["local", "ray"] = "local"  # where episodes run: worker processes here, or Ray actors
    ray_address: str = ""  # "" starts a local Ray cluster; "auto" or "ray://host:10001" joins an existing one
    episode_retries: NonNegative = 2  # times an episode the executor lost (Ray worker/node or zygote died) is retried


class EnvSection(BaseModel):
    name: str = "gsm8k"  # a built-in name, an entry point, or "package.module:factory"
    data_dir: Path | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.2
    plugin_path: list[Path] = Field(default_factory=list)  # folders to import env plugins from (+ config folder, cwd)


class UserSection(BaseModel):
    """The simulated user of conversation tasks (e.g. tau2-*). Its calls are accounted as role `user`."""

    model: str = ""  # empty means the agent's model
    max_turns: Positive = 10
    temperature: Temperature = 0.0
    max_tokens: Positive = 200


EXTERNAL_AGENT_KEYS = ("command", "callable", "env", "pass_env", "version", "max_requests")


class AgentSection(BaseModel):
    model: str = DEFAULT_MODEL
    harness: Path | None = None  # directory; default: the built-in seed for the environment
    # An external agent program (docs/agents.md): a command, or a Python callable "module:function"; each task
    # runs it with the task's public view and an OpenAI-compatible endpoint of its own (the harness applied)
    command: list[str] = Field(default_factory=list)
    callable: str = ""
    cwd: Path | None = None  # where the program runs; default: the config file's folder (else the current one)
    env: dict[str, str] = Field(default_factory=dict)  # variables set for the program
    pass_env: list[str] = Field(default_factory=list)  # host variables kept although they look like keys
    version: str = ""  # a label you change when code the command does not name changes (it enters run ids)
    max_requests: Positive = 100  # model requests one episode may make; then its endpoint refuses (429)

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        return shlex.split(value) if isinstance(value, str) else value

    @property
    def external(self) -> bool:
        """True when the agent is a program of its own (a command or a callable), not the library's loop."""
        return bool(self.command or self.callable)


class EvalSection(BaseModel):
    split: str = "val"  # train | val | test (dbbench also: dev = train + val); test only when asked for
    limit: TaskLimit = 20  # "all": every task of the split
    trials: Positive = 1
    best_of_k_max: Positive = 8  # compare's best-of-k arm: at most this many samples per test task (said when capped)
    best_of_k_temperature: Temperature = 0.7  # its sampling temperature


class SandboxSection(BaseModel):
    timeout_s: Seconds = 300.0
    memory_mb: Annotated[int, Field(ge=64)] = 2048  # the worker needs some to start Python
    cpu_s: Positive = 120
    file_mb: Positive = 64


class CacheSection(BaseModel):
    enabled: bool = True
    path: Path | None = None  # default: ~/.cache/ecdysis/responses.sqlite ($ECDYSIS_CACHE)
    # Training-phase calls (collect, roles, validation) hit only entries written under this scope;
    # `ecdysis compare` sets one per arm so every arm pays for its own training. Test runs share.
    training_scope: str = ""
    isolate_arms: bool = True  # compare: false shares training calls across arms (cheaper, flatters later arms)


class RolesSection(BaseModel):
    """Optimizer roles, each a model reference; empty means the agent's model."""

    analyst: str = ""
    critic: str = ""
    engineer: str = ""
    moderator: str = ""
    implementer: str = ""
    temperature: Temperature = 0.2
    max_tokens: Positive = 220  # debate turns
    spec_max_tokens: Positive = 900  # the Moderator's (or single analyst's) JSON spec
    # a spec refused only for the wording of a rule or tip gets a repair call (false: its valid changes are kept
    # at once; the 1.5B writers' repairs failed the same check in 141 of 147 such rounds, docs/claim.md)
    repair_wording: bool = False


class TrainBudget(BaseModel):
    """`[train.budget]`: what every arm may spend on training (None: unlimited); an arm stops when spent."""

    agent_executions: Positive | None = None  # training episodes actually run (cache-served ones do not count here)
    optimizer_tokens: Positive | None = None  # the optimizer roles' fresh tokens
    wall_s: Seconds | None = None  # training time in charged seconds (trainer/charged.py), not real wall time


class TrainEngine(BaseModel):
    """`[train.engine]`: switches of the training engine (see trainer/engine.py for what each does)."""

    skip_debate_when_verified: bool = True  # one verified zero-loss lever covers every recurring pattern
    skip_debate_when_measured: bool = False  # ... or one lever changes only failing episodes of every one
    early_stop: bool = True  # stop a validation once its rejection is certain (strict / tolerance rules)
    eval_batch: NonNegative = 0  # tasks per validation batch when early stopping; 0: 4 x run.concurrency
    screen_batch: NonNegative = 0  # > 0: candidates are screened on this many training tasks first (halving)
    stop_after_rejections: NonNegative = 2  # round proposers stop after this many rejections in a row (0: never)


class TrainSection(BaseModel):
    train_limit: TaskLimit = 20  # "all": every task of the split
    test_limit: TaskLimit = 40
    train_trials: Positive = 1
    rounds: Positive = 3
    debate_passes: NonNegative = 2
    failure_threshold: Annotated[float, Field(gt=0, le=1)] = 1.0  # a trajectory scoring below this is a failure
    # how a candidate is accepted (docs/acceptance.md): "sequential" (an exact paired test with a stated
    # false-accept rate, stopping early either way), or "strict" | "tolerance" | "noise-aware" (no error rate)
    acceptance: Literal["sequential", "strict", "tolerance", "noise-aware"] = "sequential"
    alpha: float = Field(default=0.05, gt=0.0, lt=0.5)  # sequential: the false-accept rate it holds
    min_effect: float = Field(default=0.1, gt=0.0, le=1.0)  # the smallest effect worth detecting (sizes val)
    futility: float = Field(default=0.1, ge=0.0, lt=1.0)  # sequential: stop to reject when the chance of
    # significance at min_effect falls below this (0: only when acceptance is out of reach)
    # where edits are accepted: "val" (held out from every optimizer role), "train" (the tasks the failures
    # were diagnosed on), or "auto": val when the environment has at least min_val_tasks val tasks
    accept_on: Literal["auto", "val", "train"] = "auto"
    val_limit: TaskLimit = 20
    # final-selection check before freezing (trainer/holdout.py): the trained harness against the seed on this
    # many val tasks beyond val_limit; "auto": as many as val_limit when the pool has >= 8 more; 0: off
    holdout_limit: HoldoutLimit = "auto"
    min_val_tasks: Positive = 4
    tolerance: Fraction = 0.05
    implement_attempts: Positive = 4
    implementer_command: str | None = None  # external coding agent: runs confined in a copy of the harness dir
    implementer_timeout_s: Seconds = 900.0  # the external command is killed after this long
    implementer_network: bool = False  # let the external command reach the network (a hosted model API)
    implementer_env: list[str] = Field(default_factory=list)  # host variables passed to it (e.g. its API key)
    implementer_unconfined: bool = False  # allow it to run without bubblewrap (warned, recorded with the round)
    max_evidence_per_pattern: Positive = 3
    serial_max_edits: Positive = 20  # the serial baseline's total edit attempts
    budget: TrainBudget = Field(default_factory=TrainBudget)
    engine: TrainEngine = Field(default_factory=TrainEngine)


class Config(BaseModel):
    run: RunSection = Field(default_factory=RunSection)
    env: EnvSection = Field(default_factory=EnvSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    user: UserSection = Field(default_factory=UserSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    cache: CacheSection = Field(default_factory=CacheSection)
    roles: RolesSection = Field(default_factory=RolesSection)
    train: TrainSection = Field(default_factory=TrainSection)
    model_settings: dict[str, ModelSettings] = Field(default_factory=dict)  # keyed by model reference

    def settings_for(self, ref: str) -> ModelSettings:
        return self.model_settings.get(ref, ModelSettings())

    def role_model(self, role: str) -> str:
        if role == "user":
            return self.user.model or self.agent.model
        return getattr(self.roles, role) or self.agent.model


FILE_RELATIVE_PATHS = (("agent", "harness"), ("agent", "cwd"), ("env", "data_dir"), ("run", "run_dir"),
                       ("cache", "path"))


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str], origins: dict[tuple[str, ...], str] | None = None,
                    written: dict[str, str] | None = None) -> dict[str, Any]:
    """Set each `section.key=value` (value read as TOML, else a string) in `data`. `origins` (if given) records
    which key each override set, named `--set ITEM` or as `written[ITEM]` says (e.g. `--limit 0`)."""
    for item in overrides:
        name = (written or {}).get(item, f"--set {item}")
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: an override should look like section.key=value")
        parts = key_parts(key)
        node = data
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {dotted(tuple(parts[:i + 1]))} is not a section (it holds {node!r:.40})")
        node[parts[-1]] = _parse_value(value.strip())
        if origins is not None:
            origins.pop(tuple(parts), None)  # the last override of a key is the one that counts
            origins[tuple(parts)] = name
    return data


def _unknown_keys(data: dict[str, Any], model: type[BaseModel], where: tuple[str, ...] = ()
                  ) -> list[tuple[tuple[str, ...], str]]:
    """Keys of `data` that `model` does not define (their path, and a message with the nearest valid name)."""
    problems: list[tuple[tuple[str, ...], str]] = []
    fields = model.model_fields
    prefix = dotted(where) + "." if where else ""
    for key, value in data.items():
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{near[0]}?" if near else f"; valid keys here: {', '.join(fields)}"
            problems.append(((*where, key), f"unknown key {prefix}{key}{hint}"))
            continue
        annotation = fields[key].annotation
        if isinstance(value, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            problems += _unknown_keys(value, annotation, (*where, key))
    if model is Config and isinstance(data.get("model_settings"), dict):
        for ref, settings in data["model_settings"].items():
            if isinstance(settings, dict):
                problems += _unknown_keys(settings, ModelSettings, ("model_settings", ref))
    return problems


def load_config(path: Path | None = None, overrides: list[str] | None = None,
                flags: dict[str, str] | None = None) -> Config:
    """Read TOML (optional), apply overrides, validate. Relative paths resolve against the file.

    A value that cannot run raises ConfigError naming where it came from: `--set KEY=VALUE` for an override
    (or how the user wrote it, `flags[override]`, e.g. `--limit 0` for a command-line option), else the file
    and the line that sets it."""
    data: dict[str, Any] = {}
    text = ""
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist; pass the ecdysis.toml that "
                              "`ecdysis init DIR` wrote (or leave out -c)") from exc
        except IsADirectoryError as exc:
            raise ConfigError(f"config file {path} is a directory; pass the TOML file in it "
                              f"(e.g. {Path(path) / 'ecdysis.toml'})") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); pass a TOML file") from exc
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}; see the ecdysis.toml that `ecdysis init` writes") from exc
    if path is not None:  # paths in the file are relative to the file; overrides to the cwd
        base = Path(path).resolve().parent
        for section, key in FILE_RELATIVE_PATHS:
            table = data.get(section)
            value = table.get(key) if isinstance(table, dict) else None
            if isinstance(value, str) and not Path(value).is_absolute():
                data[section][key] = str(base / value)
        agent = data.get("agent")
        if isinstance(agent, dict) and (agent.get("command") or agent.get("callable")) and not agent.get("cwd"):
            agent["cwd"] = str(base)  # an agent program runs beside its config
        env = data.setdefault("env", {})
        if isinstance(env, dict):
            plugin_path = env.get("plugin_path", [])
            if isinstance(plugin_path, list):  # anything else is left for validation to refuse
                env["plugin_path"] = [str(base / p) if isinstance(p, str) else p for p in plugin_path] + [str(base)]
            options = env.get("options")
            for key, value in (options.items() if isinstance(options, dict) else ()):
                # a task file (`path`), and any option naming a file or folder next to the config, is relative to it
                if isinstance(value, str) and value and not Path(value).is_absolute() and (
                        key == "path" or (base / value).exists()):
                    options[key] = str(base / value)
    origins: dict[tuple[str, ...], str] = {}
    apply_overrides(data, overrides or [], origins, flags)

    def where(loc: tuple[Any, ...]) -> str:
        loc = tuple(str(p) for p in loc)
        for parts, origin in reversed(origins.items()):
            if loc[:len(parts)] == parts or parts[:len(loc)] == loc:
                return origin
        line = line_of(text, loc) if path is not None else None
        return f"{path}, line {line}" if line else str(path or "config")

    problems = [f"{where(loc)}: {message}" for loc, message in _unknown_keys(data, Config)]
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems += [problem(where(e["loc"]), dotted(e["loc"]), should_be(e), e.get("input", ...))
                     for e in exc.errors()]
    if problems:  # every problem at once, so one edit fixes them all
        raise config_error(problems)
    return config
