"""A harness is a directory with `harness.toml`; its version id is the hash of its files.

Versions are plain file maps, so they can be stored in the run database, diffed, restored and
shipped. `load_harness` reads the folder with `files.read_tree` (regular files inside it only: no
links, devices or FIFOs), validates the manifest and compiles every Python layer (syntax errors
are reported with file and line) without importing anything. Every file path of a version, and
every path the manifest names, stays inside the harness folder.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from .files import HarnessError, HarnessFileError, TreeLimits, check_relative, read_tree, write_tree
from .repairs import REPAIRS_FILE, parse_repairs

__all__ = ["HarnessError", "HarnessFileError", "HarnessVersion", "Manifest", "load_harness", "version_from_files"]

MANIFEST = "harness.toml"
LAYER_FILES = ("contract", "skills", "demos", "examples", "action", "regulate", "loop")
MAX_FILE_BYTES = TreeLimits().max_file_bytes
# the function each code layer must define (harness/api.py), by the mode that uses the layer
LAYER_FUNCTIONS = {"action": ("layered", "realize(reply, ctx)"), "regulate": ("layered", "regulate(state)"),
                   "loop": ("freeform", "run(agent)")}


class Generation(BaseModel):
    temperature: float = 0.0
    max_tokens: int = 512
    top_p: float = 1.0
    stop: list[str] = Field(default_factory=list)
    samples: int = Field(default=1, ge=1, le=9)  # self-consistency: answers sampled per answer turn, majority wins
    sample_temperature: float = 0.7  # the temperature of those samples


class Budget(BaseModel):
    max_turns: int = 1
    max_rejections: int = 1
    top_k_skills: int = 3


class LayerFiles(BaseModel):
    """Layer file paths; an empty string means the layer is absent."""

    contract: str | None = "contract.md"  # H3
    skills: str | None = "skills.json"  # H5 tips
    demos: str | None = "demos.json"  # H5 demonstrations
    examples: str | None = "examples.json"  # H5 labelled training examples retrieved per task (optional file)
    action: str | None = "action.py"  # H2
    regulate: str | None = "regulate.py"  # H4
    loop: str | None = None  # free-form loop

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


class Manifest(BaseModel):
    name: str
    env: str
    mode: Literal["layered", "freeform"] = "layered"
    # "native": tools are sent with their JSON schemas through the model's function-calling API and
    # `realize` gets the calls in `reply.tool_calls`; "text": tools are described in the contract.
    tool_calling: Literal["text", "native"] = "text"
    description: str = ""
    tools: list[str] | None = None  # environment tools to offer; None = all
    generation: Generation = Field(default_factory=Generation)
    budget: Budget = Field(default_factory=Budget)
    files: LayerFiles = Field(default_factory=LayerFiles)


@dataclass(frozen=True)
class HarnessVersion:
    """An immutable snapshot: manifest plus every file's text, keyed by relative path."""

    files: dict[str, str]
    manifest: Manifest = field(compare=False)

    @property
    def id(self) -> str:
        return version_id(self.files)

    def layer_text(self, layer: str) -> str | None:
        rel = getattr(self.manifest.files, layer)
        return None if rel is None else self.files.get(rel)

    def write(self, directory: Path) -> Path:
        """Materialise into `directory` (best empty or absent): nothing is written outside it or through a
        link already there (HarnessFileError)."""
        return write_tree(self.files, directory)

    def with_files(self, changes: dict[str, str]) -> HarnessVersion:
        files = dict(self.files)
        files.update(changes)
        return version_from_files(files, origin="<candidate>")

    def to_json(self) -> str:
        return json.dumps(self.files, sort_keys=True)


def version_id(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return h.hexdigest()[:16]


def parse_manifest(text: str, origin: str) -> Manifest:
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"{origin}/{MANIFEST}: invalid TOML: {exc}") from exc
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise HarnessError(f"{origin}/{MANIFEST}: {exc}") from exc
    for layer in LAYER_FILES:  # a layer path never leaves the harness folder
        if (rel := getattr(manifest.files, layer)) is not None:
            check_relative(rel, f"{origin}/{MANIFEST}", f"files.{layer}")
    return manifest


def check_files(files: dict[str, str], manifest: Manifest, origin: str) -> None:
    """Every named layer file exists; Python compiles; JSON parses. Raises HarnessError."""
    for layer in LAYER_FILES:
        rel = getattr(manifest.files, layer)
        if rel is None:
            continue
        if rel not in files and layer == "examples":
            continue  # optional: written by the library when it adds retrieved labelled examples
        if rel not in files:
            raise HarnessError(f"{origin}: manifest names {layer} file {rel!r}, which does not exist")
        text = files[rel]
        if rel.endswith(".py"):
            try:
                tree = compile(text, f"{origin}/{rel}", "exec", ast.PyCF_ONLY_AST)
            except SyntaxError as exc:
                raise HarnessError(
                    f"{origin}/{rel}, line {exc.lineno}: syntax error: {exc.msg}"
                ) from exc
            mode, signature = LAYER_FUNCTIONS.get(layer, ("", ""))
            name = signature.partition("(")[0]
            if mode == manifest.mode and not _binds(tree.body, name):
                raise HarnessError(f"{origin}/{rel}: defines no function {name}(); the {layer} layer needs "
                                   f"`def {signature}` at the top level (see ecdysis.harness.api)")
        elif rel.endswith(".json"):
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                raise HarnessError(f"{origin}/{rel}, line {exc.lineno}: invalid JSON: {exc.msg}") from exc
    if REPAIRS_FILE in files:
        try:
            parse_repairs(files[REPAIRS_FILE])
        except (ValueError, json.JSONDecodeError) as exc:
            raise HarnessError(f"{origin}/{REPAIRS_FILE}: {exc}") from exc
    if manifest.mode == "freeform" and manifest.files.loop is None:
        raise HarnessError(f"{origin}/{MANIFEST}: mode 'freeform' needs files.loop")


def _binds(body: list[ast.stmt], name: str) -> bool:
    """Whether module-level statements may bind `name` (a def, class, assignment or import, also inside a
    top-level if/try/with); a star import may bind anything."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        blocks = [getattr(node, f, None) or [] for f in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(node, "handlers", None) or []]
        if isinstance(node, (ast.If, ast.Try, ast.With)) and any(_binds(b, name) for b in blocks):
            return True
    return False


def set_manifest_value(text: str, section: str, key: str, value: int | float | str) -> str:
    """`harness.toml` text with `[section] key = value` set (line replaced, or added to the section, or
    the section added), checked by parsing it back through the Manifest model. Raises HarnessError."""
    rendered = json.dumps(value)
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() == f"[{section}]"), None)
    if header is None:
        lines += ["", f"[{section}]", f"{key} = {rendered}"]
    else:
        end = next((i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        hit = next((i for i in range(header + 1, end) if lines[i].split("=")[0].strip() == key), None)
        if hit is None:
            lines.insert(header + 1, f"{key} = {rendered}")
        else:
            lines[hit] = f"{key} = {rendered}"
    out = "\n".join(lines) + "\n"
    manifest = parse_manifest(out, "<edited manifest>")
    if getattr(getattr(manifest, section), key) != value:
        raise HarnessError(f"setting {section}.{key} = {rendered} did not take effect in harness.toml")
    return out


def version_from_files(files: dict[str, str], origin: str) -> HarnessVersion:
    """A checked version: every path inside the folder, a manifest, layer files that parse. Raises HarnessError."""
    for rel in files:
        check_relative(rel, origin)
    if MANIFEST not in files:
        raise HarnessError(
            f"{origin}: no {MANIFEST}; a harness directory needs a manifest "
            "(create one with `ecdysis init DIR --env gsm8k`)"
        )
    manifest = parse_manifest(files[MANIFEST], origin)
    check_files(files, manifest, origin)
    return HarnessVersion(files=dict(files), manifest=manifest)


def load_harness(directory: Path | str, skip: frozenset[str] = frozenset()) -> HarnessVersion:
    """Read and validate a harness directory: its regular text files (hidden files, caches and the top-level
    names in `skip` left unread); a link, device, FIFO or oversized file raises HarnessFileError naming it."""
    return version_from_files(read_tree(directory, skip), str(directory))


def diff_versions(old: HarnessVersion, new: HarnessVersion) -> str:
    """Unified diff of two versions, file by file."""
    chunks: list[str] = []
    for rel in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(rel, ""), new.files.get(rel, "")
        if a != b:
            chunks.extend(
                difflib.unified_diff(
                    a.splitlines(keepends=True), b.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
                )
            )
    return "".join(chunks)
