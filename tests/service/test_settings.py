"""Settings saved through tomlkit, and the user's catalog extending the shipped one."""

from __future__ import annotations

import difflib
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specchat.decoding.guessers import GUESSERS
from specchat.errors import SpecchatError
from specchat.models.catalog import load_catalog, shipped_catalog_path, user_catalog_path
from specchat.service.settings import Settings, load_settings, save_settings

USER_CONFIG = """\
# my specchat settings
guesser = "none"   # plain decoding while I compare

# sampling
temperature = 0.7
my_note = "kept, though specchat does not know it"
"""


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line[:2] in ("- ", "+ ")]


def test_a_change_rewrites_only_its_own_line(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    loaded, problems = load_settings(path)
    assert loaded.guesser == "none" and loaded.temperature == 0.7 and len(problems) == 1  # my_note is reported
    save_settings(replace(loaded, guesser="lookup"), path)
    after = path.read_text()
    assert changed_lines(USER_CONFIG, after) == ['- guesser = "none"   # plain decoding while I compare',
                                                 '+ guesser = "lookup"   # plain decoding while I compare']
    assert load_settings(path)[0] == replace(loaded, guesser="lookup")


def test_saving_unchanged_settings_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    save_settings(load_settings(path)[0], path)
    assert path.read_text() == USER_CONFIG


def test_a_new_setting_is_added_at_the_end_and_defaults_are_not_written(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    save_settings(replace(load_settings(path)[0], max_tokens=64), path)
    assert path.read_text() == USER_CONFIG + "max_tokens = 64\n"
    fresh = tmp_path / "fresh.toml"
    save_settings(Settings(offline=True), fresh)
    assert fresh.read_text() == "offline = true\n"


def test_a_file_that_is_not_toml_is_kept_aside_not_overwritten(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("guesser = [unclosed\n")
    save_settings(Settings(guesser="lookup"), path)
    assert (tmp_path / "config.toml.invalid").read_text() == "guesser = [unclosed\n"
    assert load_settings(path) == (Settings(guesser="lookup"), [])


texts = st.text(st.characters(codec="utf-8"), max_size=12)  # control characters, DEL and quotes included
any_settings = st.builds(
    Settings, system_prompt=texts, temperature=st.floats(0, 5), top_p=st.floats(0, 1, exclude_min=True),
    top_k=st.integers(0, 1000), min_p=st.floats(0, 1, exclude_max=True), max_tokens=st.integers(1, 10**6),
    guesser=st.sampled_from(list(GUESSERS)), draft_length=st.integers(0, 32), pair=texts, offline=st.booleans(),
    context=st.integers(256, 1 << 20), theme=texts, threads=st.integers(0, 1024),
    gpu_layers=st.integers(-1, 10_000), draft_gpu_layers=st.integers(-1, 10_000))


@settings(max_examples=150, deadline=None, database=None,  # no .hypothesis/ in the working tree
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=any_settings, second=any_settings)
def test_any_settings_survive_saving_over_a_commented_file(tmp_path, first, second):
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    for wanted in (first, second):
        save_settings(wanted, path)
        loaded, problems = load_settings(path)
        assert loaded == wanted and problems == [f"{path} line 6: unknown setting 'my_note' ignored"]
    text = path.read_text()
    for comment in ("# my specchat settings", "# plain decoding while I compare", "# sampling"):
        assert comment in text
    assert not math.isnan(loaded.temperature)


# --- the user's catalog ----------------------------------------------------------------------

USER_CATALOG = """\
default_pair = "mine"

[models.my-model]
file = "my-model.gguf"

[pairs.mine]
target = "my-model"
draft = "qwen2.5-coder-0.5b-instruct"   # a shipped model
"""


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("SPECCHAT_CATALOG", raising=False)
    return tmp_path


def test_the_user_catalog_extends_the_shipped_one(config_home):
    shipped = load_catalog()
    user_catalog_path().parent.mkdir(parents=True)
    user_catalog_path().write_text(USER_CATALOG)
    both = load_catalog()
    assert set(both.models) == set(shipped.models) | {"my-model"}
    assert set(both.pairs) == set(shipped.pairs) | {"mine"}
    assert both.default_pair == "mine" and both.pair().draft == "qwen2.5-coder-0.5b-instruct"
    assert both.model("qwen2.5-coder-1.5b-instruct") == shipped.model("qwen2.5-coder-1.5b-instruct")


def test_a_user_catalog_without_a_default_keeps_the_shipped_default(config_home):
    user_catalog_path().parent.mkdir(parents=True)
    user_catalog_path().write_text(USER_CATALOG.replace('default_pair = "mine"\n', ""))
    assert load_catalog().default_pair == load_catalog(shipped_catalog_path()).default_pair


def test_an_error_in_the_user_catalog_names_its_file_and_line(config_home):
    user_catalog_path().parent.mkdir(parents=True)
    user_catalog_path().write_text(USER_CATALOG.replace('"qwen2.5-coder-0.5b-instruct"', '"nowhere"'))
    with pytest.raises(SpecchatError, match=f"^{user_catalog_path()} line 8: pairs.mine.draft names unknown model"):
        load_catalog()


def test_specchat_catalog_replaces_both(config_home, monkeypatch):
    user_catalog_path().parent.mkdir(parents=True)
    user_catalog_path().write_text(USER_CATALOG)
    only = config_home / "only.toml"
    only.write_text('default_pair = "p"\n[models.m]\nfile = "m.gguf"\n[pairs.p]\ntarget = "m"\ndraft = "m"\n')
    monkeypatch.setenv("SPECCHAT_CATALOG", str(only))
    assert set(load_catalog().models) == {"m"}
