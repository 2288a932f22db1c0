"""The one rule for every front end: an option given on the command line wins, the settings fill the rest."""

from __future__ import annotations

from pathlib import Path

from specchat.service.choices import (
    ModelChoice,
    RemoteChoice,
    generation,
    guesser,
    model_choice,
    same_models,
    system_prompt,
    where_to_chat,
)
from specchat.service.settings import Settings

MINE = Settings(pair="my-7b", context=8192, threads=4, gpu_layers=20, draft_gpu_layers=0, offline=True,
                temperature=0.7, top_k=40, max_tokens=300, draft_length=6)


def test_the_settings_fill_what_the_command_line_leaves_open():
    assert model_choice(ModelChoice(), MINE) == ModelChoice(pair="my-7b", n_ctx=8192, threads=4, gpu_layers=20,
                                                            draft_gpu_layers=0, offline=True)
    assert model_choice(ModelChoice(), Settings()) == ModelChoice(n_ctx=4096, gpu_layers=-1, draft_gpu_layers=-1)


def test_what_the_command_line_gives_wins():
    given = ModelChoice(pair="qwen-coder-1.5b", n_ctx=2048, threads=1, gpu_layers=0, draft_gpu_layers=5)
    assert model_choice(given, MINE) == ModelChoice("qwen-coder-1.5b", None, None, 2048, 1, 0, 5, offline=True)
    # A file given by path is not replaced by the settings' pair.
    assert model_choice(ModelChoice(target=Path("t.gguf")), MINE).pair is None


def test_sampling_given_wins_and_the_settings_fill_the_rest():
    config = generation(MINE, temperature=0.0, max_tokens=10)
    s = config.sampling
    assert (s.temperature, s.top_k, s.top_p, config.max_tokens, config.draft_length) == (0.0, 40, 1.0, 10, 6)
    assert generation(Settings()).draft_length is None  # the setting's 0 means the guesser's own default


def test_a_server_on_the_command_line_wins_over_the_setting_and_the_key_is_never_the_settings():
    server = RemoteChoice("http://a:8080", "k")
    assert where_to_chat(ModelChoice(), server, Settings(server="http://b:8080")) is server
    assert where_to_chat(ModelChoice(), None, Settings(server="http://b:8080"), "key") == \
        RemoteChoice("http://b:8080", "key")
    assert where_to_chat(ModelChoice(), None, MINE) == model_choice(ModelChoice(), MINE)


def test_a_settings_change_reloads_only_when_it_changes_what_is_loaded():
    given, settings = ModelChoice(), Settings(pair="qwen-coder-1.5b", context=4096)

    def reloads(after: Settings) -> bool:
        return not same_models(where_to_chat(given, None, settings), where_to_chat(given, None, after))

    assert not reloads(Settings(pair="qwen-coder-1.5b", context=4096, guesser="lookup", temperature=0.7))
    assert not reloads(Settings(pair="qwen-coder-1.5b", context=4096, offline=True))  # how, not which
    for changed in (Settings(pair="smollm2-self", context=4096), Settings(pair="qwen-coder-1.5b", context=8192),
                    Settings(pair="qwen-coder-1.5b", context=4096, threads=1),
                    Settings(pair="qwen-coder-1.5b", context=4096, gpu_layers=0),
                    Settings(pair="qwen-coder-1.5b", context=4096, server="http://127.0.0.1:8080")):
        assert reloads(changed), changed


def test_one_rule_for_a_guesser_the_models_cannot_run():
    wants_draft, plain_pair = Settings(guesser="draft"), ["auto", "none", "lookup"]
    # The settings' guesser: it runs where it can; elsewhere auto does, and a line says so.
    assert guesser(None, wants_draft, [*plain_pair, "draft"]) == ("draft", None)
    instead, line = guesser(None, wants_draft, plain_pair)
    assert instead == "auto" and line is not None and line.startswith("the draft guesser cannot run")
    # One given for this request is the request's: it runs, or the service refuses it (never swapped).
    assert guesser("draft", Settings(), plain_pair) == ("draft", None)
    assert guesser("lookup", wants_draft, plain_pair) == ("lookup", None)


def test_a_system_prompt_given_wins_even_when_empty():
    assert system_prompt(None, MINE) == MINE.system_prompt
    assert system_prompt("", MINE) == "" and system_prompt("Be terse.", MINE) == "Be terse."
