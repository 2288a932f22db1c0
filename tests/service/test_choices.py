"""The one rule for every front end: an option given on the command line wins, the settings fill the rest."""

from __future__ import annotations

from pathlib import Path

from specchat.service.choices import (
    Given,
    ModelChoice,
    RemoteChoice,
    answering,
    generation,
    model_choice,
    same_models,
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


PLAIN_PAIR = ["auto", "none", "lookup"]  # the guessers of a target whose draft was left out


def test_one_rule_for_a_guesser_the_models_cannot_run():
    wants_draft = Settings(guesser="draft")
    # The settings' guesser: it runs where it can; elsewhere auto does, and a line says so.
    assert answering(wants_draft, [*PLAIN_PAIR, "draft"], None).guesser == "draft"
    instead = answering(wants_draft, PLAIN_PAIR, None)
    assert instead.guesser == "auto" and instead.guesser_notice is not None
    assert instead.guesser_notice.startswith("the draft guesser cannot run") and instead.notices == [
        instead.guesser_notice]
    # One given for this request is the request's: it runs, or the service refuses it (never swapped).
    for given, settings in (("draft", Settings()), ("lookup", wants_draft)):
        named = answering(settings, PLAIN_PAIR, None, Given(guesser=given))
        assert (named.guesser, named.notices) == (given, [])


def test_a_system_prompt_given_wins_even_when_empty():
    assert answering(MINE, PLAIN_PAIR, None).system == MINE.system_prompt
    assert answering(MINE, PLAIN_PAIR, None, Given(system="")).system == ""
    assert answering(MINE, PLAIN_PAIR, None, Given(system="Be terse.")).system == "Be terse."


def test_what_the_command_line_names_of_an_answer_wins():
    settings = Settings(guesser="lookup", system_prompt="Be kind.", thinking="on", temperature=0.7, top_k=40,
                        top_p=0.9, min_p=0.1, seed=3, max_tokens=300, draft_length=6)
    given = Given("none", "Be terse.", False, 0.0, 5, 0.5, 0.0, 11, 10, 2)
    chosen = answering(settings, PLAIN_PAIR, "enable_thinking", given)
    s = chosen.config.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.0, 5, 0.5, 0.0, 11)
    assert (chosen.config.max_tokens, chosen.config.draft_length) == (10, 2)
    assert (chosen.guesser, chosen.system, chosen.think, chosen.notices) == ("none", "Be terse.", False, [])


def test_the_settings_fill_an_answer_that_names_nothing():
    settings = Settings(guesser="lookup", system_prompt="Be kind.", thinking="off", temperature=0.7, top_k=40,
                        seed=3, max_tokens=300, draft_length=6)
    chosen = answering(settings, PLAIN_PAIR, "enable_thinking")
    assert chosen.config == generation(settings)
    assert (chosen.config.sampling.temperature, chosen.config.sampling.seed, chosen.config.max_tokens) == (0.7, 3, 300)
    assert (chosen.guesser, chosen.system, chosen.think, chosen.notices) == ("lookup", "Be kind.", False, [])
    assert answering(Settings(thinking="default"), PLAIN_PAIR, "enable_thinking").think is None


def test_a_thinking_setting_the_template_has_no_switch_for_gives_way_with_a_line():
    for setting in ("on", "off"):
        chosen = answering(Settings(thinking=setting), PLAIN_PAIR, None)
        assert chosen.think is None and chosen.thinking_notice is not None
        assert chosen.thinking_notice.startswith("this model's chat template has no switch for thinking")
        assert f"({setting})" in chosen.thinking_notice and chosen.notices == [chosen.thinking_notice]
    assert answering(Settings(thinking="default"), PLAIN_PAIR, None).notices == []  # nothing was asked
    # Asked for by the request, it goes to the template, which refuses it (ChatService.template_variables).
    assert answering(Settings(thinking="on"), PLAIN_PAIR, None, Given(think=False)).think is False
    # Both lines, the guesser's first, as generate prints them.
    both = answering(Settings(guesser="draft", thinking="on"), PLAIN_PAIR, None)
    assert both.notices == [both.guesser_notice, both.thinking_notice] and None not in both.notices


def test_raw_text_has_no_system_prompt_and_no_thinking_to_say_anything_of():
    settings = Settings(guesser="draft", system_prompt="Be kind.", thinking="on")
    raw = answering(settings, PLAIN_PAIR, None, Given(raw=True, max_tokens=7))
    assert (raw.system, raw.think, raw.thinking_notice, raw.config.max_tokens) == ("", None, None, 7)
    assert raw.guesser == "auto" and raw.notices == [raw.guesser_notice]  # the guesser's rule holds all the same
