"""`trl-es evolm`'s own arguments: the judge they build (one server, a panel, an in-process model) and the EvolmConfig
settings they set."""

import pytest

from trl_es.cli.evolm import EvolmArguments
from trl_es.evolm import JudgePanel, OpenAIJudge
from trl_es.evolm.diagnostics import EvalVerifier


def verifier() -> EvalVerifier:
    return EvalVerifier(lambda question, answer: answer == "4", held_out_questions=("2 + 2?",))


def test_a_list_of_judge_urls_is_a_panel_with_the_key_of_its_variable(monkeypatch):
    monkeypatch.setenv("TRL_ES_TEST_KEY", "sk-abc")
    arguments = EvolmArguments(
        judge_panel_urls=["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
        judge_panel_reduce="median",
        judge_model="judge",
        judge_api_key_env="TRL_ES_TEST_KEY",
    )
    panel = arguments.judge()
    assert isinstance(panel, JudgePanel) and panel.reduce == "median"
    assert [judge.base_url for judge in panel.judges] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert all(judge._headers == {"Authorization": "Bearer sk-abc"} for judge in panel.judges)
    assert isinstance(EvolmArguments(judge_url="http://127.0.0.1:8001").judge(), OpenAIJudge)


def test_the_settings_reach_evolm_config_with_json_pair_weights_and_an_imported_verifier():
    arguments = EvolmArguments(
        judge_url="http://127.0.0.1:8001",
        pair_weights='{"temporal": 2, "inferred": 1}',
        rubric_temperature=0.5,
        format_reward_weight=0.25,
        verifier=f"{__name__}.verifier",
        guard_steps=5,
        guard_action="rollback",
        live_rubrics=True,
    )
    settings = arguments.evolm_settings()
    assert settings["live_rubrics"] is True
    assert settings["pair_weights"] == {"temporal": 2, "inferred": 1}
    assert settings["rubric_temperature"] == 0.5 and settings["format_reward_weight"] == 0.25
    assert settings["guard_steps"] == 5 and settings["guard_action"] == "rollback"
    assert settings["verifier"].held_out_questions == ("2 + 2?",)


def test_no_judge_at_all_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="pass --judge_url"):
        EvolmArguments()


def test_each_role_is_anchored_by_its_own_field_es_kl_anchor_beta_and_grpo_beta(tmp_path):
    from trl_es import ESConfig

    arguments = EvolmArguments(judge_url="http://127.0.0.1:8001", policy_method="es", rubric_method="grpo")
    top_level = ESConfig(str(tmp_path), kl_anchor_beta=0.01, beta=0.001, max_steps=1, report_to=[], use_cpu=True)
    policy, rubric = arguments.role_config(top_level, "policy"), arguments.role_config(top_level, "rubric")
    assert type(policy) is ESConfig and policy.kl_anchor_beta == 0.01
    assert type(rubric) is not ESConfig and rubric.beta == 0.001
