"""What the run-starting commands share to build their config (`-c`, then `--set`, then their own flags),
and the errors every command reports as user errors (exit 2 with the message)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..config import Config, ConfigError, load_config
from ..envs import DataNotFoundError, TaskFileError, UnknownEnvironmentError
from ..harness.manifest import HarnessError
from ..models import ModelConfigError, ModelError
from ..store.db import RunDirBusy

USER_ERRORS = (RunDirBusy, ConfigError, HarnessError, TaskFileError, DataNotFoundError, UnknownEnvironmentError,
               ModelConfigError, ModelError, FileNotFoundError, ValueError)

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override: section.key=value.")]


# the command-line option that sets a config key, where it is not `--` + the key's last part (for error messages)
OPTION_OF = {"env.name": "--env", "user.model": "--user-model", "env.options.path": "--tasks",
             "sandbox.timeout_s": "--timeout", "run.progress": "--json",
             **{f"roles.{r}": "--roles-model" for r in ("analyst", "critic", "engineer", "moderator", "implementer")}}


def build_config(config: Path | None, sets: list[str] | None, **flags: object) -> Config:
    """Config file, then --set overrides, then explicit flags (those not None). An error names the option."""
    overrides = list(sets or [])
    written: dict[str, str] = {}
    for key, value in flags.items():
        if value is not None:
            overrides.append(f"{key}={json.dumps(str(value)) if isinstance(value, (str, Path)) else value}")
            option = OPTION_OF.get(key, "--" + key.rpartition(".")[2].replace("_", "-"))
            written[overrides[-1]] = option if isinstance(value, bool) else f"{option} {value}"
    return load_config(config, overrides, written)
