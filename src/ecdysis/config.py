"""The typed configuration root, read from TOML with `section.key=value` overrides.

Secrets never live here: a model's API key is read from the environment variable its settings
name (`api_key_env`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from .models.local_models import DEFAULT_LOCAL_MODEL
from .models.registry import ModelSettings

DEFAULT_MODEL = f"local:{DEFAULT_LOCAL_MODEL}"


class ConfigError(ValueError):
    pass


# run settings that change where and how fast episodes run, never their results (kept out of run ids)
EXECUTION_ONLY = ("progress", "executor", "ray_address", "episode_retries")


class RunSection(BaseModel):
    run_dir: Path = Path("runs/default")
    seed: int = 0
    concurrency: int = 2
    progress: bool = True
    max_agent_tokens: int | None = None  # budget for fresh (uncached) agent tokens; then no new episodes start
    executor: Literal["local", "ray"] = "local"  # where episodes run: worker processes here, or Ray actors
    ray_address: str = ""  # "" starts a local Ray cluster; "auto" or "ray://host:10001" joins an existing one
    episode_retries: int = 2  # times an episode the executor lost (Ray worker/node or zygote died) is retried


class EnvSection(BaseModel):
    name: str = "gsm8k"  # a built-in name, an entry point, or "package.module:factory"
    data_dir: Path | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    val_fraction: float = 0.2
    plugin_path: list[Path] = Field(default_factory=list)  # folders to import env plugins from (+ config folder, cwd)


class UserSection(BaseModel):
    """The simulated user of conversation tasks (e.g. tau2-*). Its calls are accounted as role `user`."""

    model: str = ""  # empty means the agent's model
    max_turns: int = 10
    temperature: float = 0.0
    max_tokens: int = 200


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
    max_requests: int = 100  # model requests one episode may make; then its endpoint refuses (429)

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
    limit: int | None = 20
    trials: int = 1
    best_of_k_max: int = 8  # compare's best-of-k arm: at most this many samples per test task (result says when capped)
    best_of_k_temperature: float = 0.7  # its sampling temperature


class SandboxSection(BaseModel):
    timeout_s: float = 300.0
    memory_mb: int = 2048
    cpu_s: int = 120
    file_mb: int = 64


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
    temperature: float = 0.2
    max_tokens: int = 220  # debate turns
    spec_max_tokens: int = 900  # the Moderator's (or single analyst's) JSON spec


class TrainBudget(BaseModel):
    """`[train.budget]`: what every arm may spend on training (None: unlimited); an arm stops when spent."""

    agent_executions: int | None = None  # training episodes actually run (cache-served ones are free)
    optimizer_tokens: int | None = None  # the optimizer roles' fresh tokens
    wall_s: float | None = None  # training wall time


class TrainEngine(BaseModel):
    """`[train.engine]`: switches of the training engine (see trainer/engine.py for what each does)."""

    skip_debate_when_verified: bool = True  # one verified zero-loss lever covers every recurring pattern
    skip_debate_when_measured: bool = False  # ... or one lever changes only failing episodes of every one
    early_stop: bool = True  # stop a validation once its rejection is certain (strict / tolerance rules)
    eval_batch: int = 0  # tasks per validation batch when early stopping; 0: 4 x run.concurrency
    screen_batch: int = 0  # > 0: candidates are screened on this many training tasks first (halving)
    stop_after_rejections: int = 2  # round proposers stop after this many rejections in a row (0: never)


class TrainSection(BaseModel):
    train_limit: int | None = 20
    test_limit: int | None = 40
    train_trials: int = 1
    rounds: int = 3
    debate_passes: int = 2
    failure_threshold: float = 1.0  # a trajectory scoring below this is a failure
    acceptance: Literal["strict", "tolerance", "noise-aware"] = "strict"
    # where edits are accepted: "val" (held out from every optimizer role), "train" (the tasks the failures
    # were diagnosed on), or "auto": val when the environment has at least min_val_tasks val tasks
    accept_on: Literal["auto", "val", "train"] = "auto"
    val_limit: int | None = 20
    min_val_tasks: int = 4
    tolerance: float = 0.05
    implement_attempts: int = 4
    implementer_command: str | None = None  # external coding agent: runs confined in a copy of the harness dir
    implementer_timeout_s: float = 900.0  # the external command is killed after this long
    implementer_network: bool = False  # let the external command reach the network (a hosted model API)
    implementer_env: list[str] = Field(default_factory=list)  # host variables passed to it (e.g. its API key)
    implementer_unconfined: bool = False  # allow it to run without bubblewrap (warned, recorded with the round)
    max_evidence_per_pattern: int = 3
    serial_max_edits: int = 20  # the serial baseline's total edit attempts
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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} should look like section.key=value")
        parts = [p.strip('"') for p in re.findall(r'"[^"]*"|[^.]+', key.strip())]  # quoted parts may hold dots
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[parts[-1]] = _parse_value(value.strip())
    return data


def _unknown_keys(data: dict[str, Any], model: type[BaseModel], where: str) -> list[str]:
    """Keys of `data` that `model` does not define, each with the nearest valid name if there is one."""
    problems: list[str] = []
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean {where}{near[0]}?" if near else f"; valid keys here: {', '.join(fields)}"
            problems.append(f"unknown key {where}{key}{hint}")
            continue
        annotation = fields[key].annotation
        if isinstance(value, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            problems += _unknown_keys(value, annotation, f"{where}{key}.")
    if model is Config and isinstance(data.get("model_settings"), dict):
        for ref, settings in data["model_settings"].items():
            if isinstance(settings, dict):
                problems += _unknown_keys(settings, ModelSettings, f'model_settings."{ref}".')
    return problems


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read TOML (optional), apply overrides, validate. Relative paths resolve against the file."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    if path is not None:  # paths in the file are relative to the file; overrides to the cwd
        base = Path(path).resolve().parent
        for section, key in FILE_RELATIVE_PATHS:
            value = data.get(section, {}).get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                data[section][key] = str(base / value)
        agent = data.get("agent")
        if isinstance(agent, dict) and (agent.get("command") or agent.get("callable")) and not agent.get("cwd"):
            agent["cwd"] = str(base)  # an agent program runs beside its config
        env = data.setdefault("env", {})
        env["plugin_path"] = [str(base / p) for p in env.get("plugin_path", [])] + [str(base)]
        options = env.get("options")
        for key, value in (options.items() if isinstance(options, dict) else ()):
            # a task file (`path`), and any option naming a file or folder next to the config, is relative to it
            if isinstance(value, str) and value and not Path(value).is_absolute() and (
                    key == "path" or (base / value).exists()):
                options[key] = str(base / value)
    apply_overrides(data, overrides or [])
    problems = _unknown_keys(data, Config, "")
    if problems:
        raise ConfigError(f"{path or 'config'}: " + "; ".join(problems))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from exc


# Settings that say where things are, not what a run computes: kept out of run ids (with the execution-only
# ones), so a run resumes after its project folder moves.
LOCATION_ONLY: dict[str, set[str]] = {"run": {"run_dir", *EXECUTION_ONLY}, "env": {"data_dir", "plugin_path"},
                                      "cache": {"path"}, "agent": {"cwd"}}


def _content_hash(path: Path) -> str:
    """sha256 (16 hex) of a file, or of a directory's files (relative names and bytes; hidden and caches skipped)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(path).parts))
    for file in files:
        h.update(file.relative_to(path).as_posix().encode() if file != path else b"")
        h.update(b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _portable(value: Any) -> Any:
    """An option value with absolute file paths replaced by their content hash (`file.py:function` keeps the
    function), directories by their name; anything else unchanged."""
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    head, sep, tail = value.rpartition(":") if ".py:" in value else (value, "", "")
    path = Path(head)
    if path.is_file():
        return f"sha256:{_content_hash(path)}{sep}{tail}"
    return f"{path.name}{sep}{tail}"


def _portable_ref(ref: str) -> str:
    """A model reference with a local GGUF path reduced to its file name (`local:/x/m.gguf` -> `local:m.gguf`)."""
    return f"local:{Path(ref[6:]).name}" if ref.startswith("local:/") else ref


def identity_json(config: Config) -> str:
    """The config as far as it decides a run's results, as canonical JSON (what run ids hash): execution-only
    and location-only settings left out, the harness directory and files named in `env.options` standing for
    a hash of their content, local model paths for their file names. Moving the project folder keeps it."""
    data = config.model_dump(mode="json", exclude=LOCATION_ONLY)  # type: ignore[arg-type]
    if config.agent.harness is not None:
        harness = Path(config.agent.harness)
        data["agent"]["harness"] = f"sha256:{_content_hash(harness)}" if harness.exists() else harness.name
    data["agent"]["model"] = _portable_ref(config.agent.model)
    if config.agent.external:  # the program's files (a script the command names) stand for their content
        from .external.program import program_fingerprint

        data["agent"]["command"] = program_fingerprint(config.agent)
    else:  # the library's own loop: the same identity as before agent programs existed
        for key in EXTERNAL_AGENT_KEYS:
            data["agent"].pop(key, None)
    data["user"]["model"] = _portable_ref(config.user.model)
    for role in ("analyst", "critic", "engineer", "moderator", "implementer"):
        data["roles"][role] = _portable_ref(getattr(config.roles, role))
    data["model_settings"] = {_portable_ref(k): v for k, v in data["model_settings"].items()}
    data["env"]["options"] = _portable(data["env"]["options"])
    return json.dumps(data, sort_keys=True, default=str)
