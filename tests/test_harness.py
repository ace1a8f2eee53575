"""Harness directories: load, hash, diff, save/restore, and clear errors for broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecdysis.harness.manifest import HarnessError, diff_versions, load_harness
from ecdysis.harness.skills import Skill, retrieve
from ecdysis.store import RunStore
from ecdysis.workspace import seed_harness_dir


def copy_seed(tmp_path: Path, env: str = "gsm8k") -> Path:
    target = tmp_path / "h"
    load_harness(seed_harness_dir(env)).write(target)
    return target


def test_version_id_is_content_hash(tmp_path: Path) -> None:
    path = copy_seed(tmp_path)
    a = load_harness(path)
    assert a.id == load_harness(path).id
    (path / "contract.md").write_text("Different rules.\n")
    b = load_harness(path)
    assert a.id != b.id
    diff = diff_versions(a, b)
    assert "-Answer: <number>" in diff and "+Different rules." in diff and "a/contract.md" in diff
    assert diff_versions(a, a) == ""


def test_save_and_restore_through_the_store(tmp_path: Path) -> None:
    version = load_harness(copy_seed(tmp_path))
    store = RunStore(tmp_path / "run")
    store.save_version(version)
    restored = store.load_version(version.id)
    assert restored.files == version.files and restored.id == version.id
    out = restored.write(tmp_path / "restored")
    assert load_harness(out).id == version.id


def test_missing_manifest(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarnessError, match="no harness.toml"):
        load_harness(tmp_path / "empty")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = copy_seed(tmp_path)
    (path / "action.py").write_text("import re\n\ndef realize(reply, ctx)\n    return None\n")
    with pytest.raises(HarnessError, match=r"action\.py, line 3: syntax error"):
        load_harness(path)


def test_bad_manifest_and_missing_layer_file(tmp_path: Path) -> None:
    path = copy_seed(tmp_path)
    (path / "regulate.py").unlink()
    with pytest.raises(HarnessError, match="regulate file 'regulate.py', which does not exist"):
        load_harness(path)
    (path / "harness.toml").write_text("name = \n")
    with pytest.raises(HarnessError, match="invalid TOML"):
        load_harness(path)
    (path / "harness.toml").write_text('name = "x"\nenv = "gsm8k"\nmode = "wild"\n')
    with pytest.raises(HarnessError, match="mode"):
        load_harness(path)


def test_skill_retrieval_prefers_matching_tips() -> None:
    skills = [Skill("a", "*", "Always check units."), Skill("b", "percent discount", "Convert percent to a fraction."),
              Skill("c", "train speed distance", "distance = speed * time")]
    picked = retrieve(skills, "A shirt has a 20 percent discount. What is the price?", top_k=1)
    assert [s.id for s in picked] == ["a", "b"]
    assert [s.id for s in retrieve(skills, "unrelated words", top_k=2)] == ["a"]


def test_manifest_values_are_set_through_the_manifest_model() -> None:
    import pytest

    from ecdysis.harness.manifest import HarnessError, parse_manifest, set_manifest_value

    text = 'name = "x"\nenv = "gsm8k"\n\n[generation]\ntemperature = 0\n\n[budget]\nmax_turns = 2\n'
    hot = set_manifest_value(text, "generation", "temperature", 0.7)  # `= 0` is not the text `= 0.0`
    assert parse_manifest(hot, "t").generation.temperature == 0.7
    longer = set_manifest_value('name = "x"\nenv = "gsm8k"\n', "generation", "max_tokens", 600)
    assert parse_manifest(longer, "t").generation.max_tokens == 600  # the section did not exist
    with pytest.raises(HarnessError):
        set_manifest_value(text, "generation", "max_tokens", "many")


def test_implementer_replies_that_are_not_an_object_are_check_failures() -> None:
    import pytest

    from ecdysis.trainer.checks import CheckFailed
    from ecdysis.trainer.implement import reply_content

    assert reply_content('{"content": "x = 1"}') == "x = 1"
    for bad, why in (('["a", "b"]', "got list"), ("not json", "not JSON"), ('{"content": 3}', "string 'content'")):
        with pytest.raises(CheckFailed, match=why):
            reply_content(bad)


def test_a_written_seed_is_valid_toml_whatever_the_environment_is_called() -> None:
    """An environment reference with a quote or a backslash in it still gives a manifest that parses, naming it."""
    import tomllib
    from types import SimpleNamespace

    from ecdysis.harness.generic_seed import generic_seed_files

    for name in ('my "quoted" env', "plugins\\env:environment", "plain_env:environment"):
        manifest = tomllib.loads(generic_seed_files(name, SimpleNamespace())["harness.toml"])
        assert manifest["env"] == name and manifest["name"] == f"{name.replace(':', '-')}-seed"
