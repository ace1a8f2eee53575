"""Wires a `Config` into live parts: run store, response cache, metered models, environment, runner."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from .config import Config
from .envs import Environment, Task, get_environment, plugin_root, seeded_order
from .harness.generic_seed import generic_seed
from .harness.manifest import HarnessError, HarnessVersion, load_harness
from .models import ChatModel, MeteredModel, ResponseCache, build_model, default_cache_path
from .runner import Runner
from .runner.executors import Executor, make_executor
from .sandbox import SandboxLimits
from .sandbox.view import plugin_view
from .store import RunStore, claim_run_dir


def plugin_search(config: Config) -> list[Path]:
    """Where environment plugins are imported from: configured folders, the config's folder, the cwd."""
    return [*config.env.plugin_path, Path.cwd()]


def seed_harness_dir(env: str) -> Path:
    """The built-in seed harness for an environment (shipped as package data)."""
    path = Path(str(resources.files("ecdysis.harness") / "seeds" / env))
    if not path.is_dir():
        raise FileNotFoundError(f"no built-in seed harness for environment {env!r}; "
                                f"write one with `ecdysis init DIR --env {env}`")
    return path


def check_code_loads(version: HarnessVersion, where: Path | str) -> None:
    """Import a layered harness's code (H2 `action.py`, H4 `regulate.py`) once in a sandboxed worker, never in
    this process: a file that fails to import or lacks its layer's function is refused now with a HarnessError
    naming it, instead of crashing every episode."""
    m = version.manifest
    if m.mode != "layered" or not (m.files.action or m.files.regulate):
        return
    from .serve.sandboxed import LayerCodeError, probe

    try:
        probe(version.files)
    except LayerCodeError as exc:
        message = re.sub(r"[\w.]*HarnessLoadError: ", "", str(exc))
        raise HarnessError(f"{where}: {message}") from None


@dataclass
class Workspace:
    config: Config
    env: Environment
    backends: dict[str, ChatModel] = field(default_factory=dict)  # "role|ref" -> backend
    models: dict[str, MeteredModel] = field(default_factory=dict)  # "role|ref|scope" -> metered client

    @classmethod
    def open(cls, config: Config) -> Workspace:
        env = get_environment(config.env.name, data_dir=config.env.data_dir, seed=config.run.seed,
                              search=plugin_search(config), **config.env.options)
        if config.agent.external:  # a program that cannot start fails now, before anything is written
            from .external.program import AgentProgram

            AgentProgram.from_config(config.agent)
        return cls(config=config, env=env)

    @cached_property
    def store(self) -> RunStore:
        """Created on first use, so a command that fails validation writes nothing. The run directory is
        claimed for this process: a second process writing to it is refused (RunDirBusy)."""
        store = RunStore(self.config.run.run_dir)
        claim_run_dir(store.run_dir)
        return store

    @cached_property
    def cache(self) -> ResponseCache | None:
        c = self.config.cache
        return ResponseCache(c.path or default_cache_path()) if c.enabled else None

    def model(self, ref: str, role: str = "agent", cache_scope: str = "") -> MeteredModel:
        """One metered client per (role, reference, cache scope); backends are shared per process."""
        key = f"{role}|{ref}|{cache_scope}"
        if key not in self.models:
            if f"{role}|{ref}" not in self.backends:
                # the simulated user gets its own local context, so agent and user do not evict each other's KV
                settings = self.config.settings_for(ref)
                if settings.slots is None:  # one context per concurrent episode on the embedded backend
                    settings = settings.model_copy(update={"slots": self.config.run.concurrency})
                self.backends[f"{role}|{ref}"] = build_model(ref, settings, instance="user" if role == "user" else "")
            self.models[key] = MeteredModel(self.backends[f"{role}|{ref}"], cache=self.cache, role=role,
                                            scope=cache_scope)
        return self.models[key]

    def harness(self) -> HarnessVersion:
        """The configured harness (its code loaded once in the sandbox: `check_code_loads`); else the built-in
        seed; else a seed written from the environment (for an agent program: the agent seed, which adds nothing)."""
        if self.config.agent.harness:
            version = load_harness(self.config.agent.harness)
            check_code_loads(version, self.config.agent.harness)
            return version
        if self.config.agent.external:
            from .external.seed import agent_seed

            return agent_seed(self.config.env.name)
        try:
            return load_harness(seed_harness_dir(self.config.env.name))
        except FileNotFoundError:
            return generic_seed(self.config.env.name, self.env)

    def tasks(self, split: str, limit: int | None) -> list[Task]:
        ordered = seeded_order(self.env.tasks(split), self.config.run.seed)
        return ordered[:limit] if limit else ordered

    def runner(self, run_id: str, model_ref: str | None = None, cache_scope: str = "") -> Runner:
        s, u = self.config.sandbox, self.config.user
        plugin = plugin_root(self.config.env.name, plugin_search(self.config))
        plugin_paths = [plugin] if plugin else []
        # the sandbox gets ready (a zygote imports the agent loop) while the models load
        self.executor.prepare(plugin_view(self.config.env.name, plugin_paths,
                                          [str(f) for f in getattr(self.env, "sandbox_files", ()) or ()],
                                          [str(h) for h in getattr(self.env, "sandbox_hidden", ()) or ()]),
                              self.config.env.name)
        return Runner(
            store=self.store, run_id=run_id,
            model=self.model(model_ref or self.config.agent.model, cache_scope=cache_scope),
            env=self.env, env_name=self.config.env.name, env_options=self.config.env.options,
            limits=SandboxLimits(timeout_s=s.timeout_s, memory_mb=s.memory_mb, cpu_s=s.cpu_s, file_mb=s.file_mb),
            concurrency=self.config.run.concurrency, show_progress=self.config.run.progress,
            max_agent_tokens=self.config.run.max_agent_tokens,
            user_model=(self.model(self.config.role_model("user"), role="user", cache_scope=cache_scope)
                        if getattr(self.env, "conversational", False) else None),
            user_settings={"max_turns": u.max_turns, "temperature": u.temperature, "max_tokens": u.max_tokens},
            plugin_paths=plugin_paths, executor=self.executor,
        )

    @cached_property
    def executor(self) -> Executor:
        """One executor per workspace (a Ray executor keeps its actors between evaluations; an agent program's
        keeps its endpoint)."""
        r = self.config.run
        if self.config.agent.external:
            from .external.executor import agent_executor

            return agent_executor(self.config, self.env)
        return make_executor(r.executor, r.ray_address, slots=r.concurrency, retries=r.episode_retries)

    def close(self) -> None:
        if "executor" in self.__dict__:
            self.executor.close()
        if "store" in self.__dict__:
            self.store.close()
        if self.__dict__.get("cache") is not None:
            self.cache.close()
