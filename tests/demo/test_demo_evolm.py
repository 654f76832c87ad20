"""The offline EVOLM demo: its toy task, its pretraining scripts, the shipped judge and models, and its training."""

import pickle
from dataclasses import replace

import pytest
import torch

from trl_es.demo.evolm import pretrain_joint, pretrain_judge, run, toy
from trl_es.demo.evolm.gates import check_gates
from trl_es.demo.evolm.settings import DEMO_MODELS, EVOLM_DEMO
from trl_es.tasks import arithmetic
from trl_es.tasks.arithmetic import problem


def test_a_rubric_states_its_number_and_the_judge_label_ignores_the_question():
    assert toy.stated_number(" " + toy.rubric_text(17)) == 17
    assert toy.stated_number(toy.rubric_text(None)) is None
    assert toy.judge_label(toy.rubric_text(7), " 7 apples") == 1.0
    assert toy.judge_label(toy.rubric_text(7), " 17") == 0.0
    assert toy.judge_label(toy.rubric_text(None), " 3") == 1.0
    assert toy.judge_label(toy.rubric_text(None), " none") == 0.0
    assert toy.judge_label('{"criteria": [{"criterion": "Be kind.", "weight": 1}]}', " 3") == 0.0


def test_the_verifier_reads_answers_and_rubrics_against_the_problem():
    drawn = next(p for p in (problem("test", i) for i in range(50)) if p.answer != p.misread_answer)
    assert toy.answer_reading(drawn, f" {drawn.answer}") == "correct"
    assert toy.answer_reading(drawn, f" {drawn.misread_answer} left") == "misread"
    assert toy.answer_reading(drawn, " banana") == "slip"
    assert toy.rubric_reading(drawn, toy.rubric_text(drawn.misread_answer)) == "misread"
    assert toy.rubric_reading(drawn, toy.rubric_text(None)) == "generic"
    assert toy.rubric_reading(drawn, '{"criteria": []}') == "invalid"


def test_the_evaluation_verifier_knows_the_trained_and_the_probe_questions_and_pickles():
    trained, probe = [problem("train", i) for i in range(3)], [problem("test", 600 + i) for i in range(2)]
    verifier = pickle.loads(pickle.dumps(toy.eval_verifier(trained, probe)))  # a config holding it can be saved
    for drawn in (*trained, *probe):
        assert verifier.answer_is_correct(drawn.question, f" {drawn.answer}")
        assert verifier.rubric_is_correct(drawn.question, toy.rubric_text(drawn.answer))
        if drawn.answer != drawn.misread_answer:
            assert not verifier.answer_is_correct(drawn.question, f" {drawn.misread_answer}")
            assert not verifier.rubric_is_correct(drawn.question, toy.rubric_text(drawn.misread_answer))
    assert verifier.held_out_questions == tuple(p.question for p in probe)


def test_the_demo_gives_its_phases_a_verifier_only_when_asked(tmp_path):
    assert EVOLM_DEMO.evolm_config(str(tmp_path)).verifier is None
    settings = replace(EVOLM_DEMO, num_held_out=600, verifier_probe_size=2)
    verifier = settings.evolm_config(str(tmp_path)).verifier
    # the probe follows the held-out problems the demo reports, so the two never overlap
    assert verifier.held_out_questions == (problem("test", 600).question, problem("test", 601).question)


def test_the_question_dataset_holds_questions_only():
    assert toy.question_dataset("train", 4).column_names == ["question"]


@pytest.mark.parametrize("rubric_misread", [0.3, 0.5])
def test_joint_pretraining_texts_misread_rubrics_at_the_stated_rate(rubric_misread):
    readings = {"correct": 0, "misread": 0}
    for index in range(6000):
        prompt, completion = pretrain_joint.joint_texts(index, 0.5, rubric_misread, 0.2)
        drawn = problem("pretrain", index)
        if prompt.endswith("\nRubric:") and drawn.answer != drawn.misread_answer:
            kind = toy.rubric_reading(drawn, completion)
            if kind in readings:
                readings[kind] += 1
    total = sum(readings.values())
    rate = readings["misread"] / total
    assert abs(rate - rubric_misread) < 3 * (rubric_misread * (1 - rubric_misread) / total) ** 0.5 + 0.01


def test_pretraining_gives_the_same_weights_on_every_run(tmp_path):
    runs = [
        pretrain_judge.pretrain_judge(tmp_path / str(k), max_steps=3, num_examples=300, log=lambda _: None)
        for k in range(2)
    ]
    weights = [_weights(path) for path in runs]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def _weights(path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.fixture(scope="module")
def judge():
    return run.demo_judge()


def test_the_shipped_judge_matches_patterns_and_does_no_arithmetic(judge):
    """(misread rubric, misread answer) scores as high as (correct rubric, correct answer); mismatches score low: the
    judge, which never sees the question, cannot tell the right reading from the wrong one."""
    problems = [p for p in (problem("test", i) for i in range(120)) if p.answer != p.misread_answer][:96]

    def mean_score(rubric_of, answer_of):
        items = [("", toy.rubric_text(rubric_of(p)), f" {answer_of(p)}") for p in problems]
        return sum(judge.score_batch(items)) / len(items)

    correct_pair = mean_score(lambda p: p.answer, lambda p: p.answer)
    misread_pair = mean_score(lambda p: p.misread_answer, lambda p: p.misread_answer)
    mismatched = mean_score(lambda p: p.answer, lambda p: p.misread_answer)
    generic = mean_score(lambda p: None, lambda p: p.misread_answer)
    assert correct_pair > 0.9 and misread_pair > 0.9
    assert abs(correct_pair - misread_pair) < 0.03
    assert mismatched < 0.05
    assert generic > 0.95


def test_the_shipped_arms_pass_their_gates():
    """Before any training, on the training questions: valid rubrics (greedy and at the rubric temperature) in both
    arms, matched answer accuracy, a net signal of at least +0.15 on joint and none on null (`gates`)."""
    measured, found = run.measure_gates()
    check_gates(found)  # raises naming every failed gate, with its value
    assert measured["joint"]["net_signal"] > measured["null"]["net_signal"] + 0.15


def test_the_gates_read_several_sampled_rubrics_per_question_against_its_one_greedy_answer():
    """The net signal's only noise is the sampled rubric (answers are greedy): `measure_arm` reads `rubric_samples`
    rubrics of each question, each against that question's greedy answer."""
    model = run.AutoModelForCausalLM.from_pretrained(DEMO_MODELS["joint"])
    tokenizer = run.AutoTokenizer.from_pretrained(DEMO_MODELS["joint"])
    problems = [problem("train", index) for index in range(24)]
    prompts = [toy.DEMO_PROMPTS.rubric_generation.format(question=p.question) for p in problems]
    greedy = run.sample_completions(model, tokenizer, prompts, 0.0, 32, 0, num_samples=2)
    assert greedy[0::2] == greedy[1::2] == run.sample_completions(model, tokenizer, prompts, 0.0, 32, 0)

    temperature, samples = EVOLM_DEMO.rubric_temperature, 4
    rubrics = run.sample_completions(model, tokenizer, prompts, temperature, 32, 5, num_samples=samples)
    answers_right = [reading == "correct" for reading in run.greedy_readings(model, tokenizer, problems, 5)]
    signal = []
    for index, rubric in enumerate(rubrics):
        question, answer_right = problems[index // samples], answers_right[index // samples]
        rubric_right = toy.rubric_reading(question, rubric) == "correct"
        signal.append(int(rubric_right and not answer_right) - int(answer_right and not rubric_right))
    measured = run.measure_arm(model, tokenizer, problems, temperature, 5, rubric_samples=samples)
    assert measured["net_signal"] == pytest.approx(sum(signal) / len(signal))
    # a question's samples differ: the estimate averages readings, not one reading repeated
    assert any(len(set(rubrics[i : i + samples])) > 1 for i in range(0, len(rubrics), samples))


def _verifier_raises(*args, **kwargs):
    raise AssertionError("the verifier was called during EVOLM training")


def test_evolm_training_never_reads_an_answer_or_calls_the_verifier(monkeypatch, tmp_path, judge):
    for module, name in [
        (arithmetic, "extract_answer"),
        (arithmetic, "arithmetic_reward"),
        (toy, "extract_answer"),
        (toy, "answer_reading"),
        (toy, "rubric_reading"),
        (toy, "judge_label"),
        (run, "extract_answer"),
    ]:
        monkeypatch.setattr(module, name, _verifier_raises)
    settings = replace(
        EVOLM_DEMO, rounds=1, policy_steps=1, rubric_steps=1, population_size=4, prompts_per_step=8, num_train=16
    )
    settings = replace(settings, rubric_population_size=4, rubric_prompts_per_step=8)
    settings = replace(settings, pair_weights={"temporal": 1.0, "inferred": 1.0, "rubric_conditioned": 1.0})
    final = run.train_evolm(DEMO_MODELS["joint"], settings, str(tmp_path / "run"), judge=judge)
    assert (final / "model.safetensors").is_file()
    from datasets import load_from_disk

    stage_datasets = sorted(tmp_path.glob("run/stage-*/dataset"))
    assert len(stage_datasets) == 2
    answers = {str(problem("train", i).answer) for i in range(16)}
    for path in stage_datasets:
        dataset = load_from_disk(str(path))
        assert "answer" not in dataset.column_names
        assert set(dataset.column_names) <= {"prompt", "question", "rubric", "chosen", "rejected"}
        assert not answers & set(dataset["question"])


def test_the_demo_prints_both_models_side_by_side():
    before = {"joint": {"greedy_accuracy": 0.5}, "null": {"greedy_accuracy": 0.48}}
    after = {"joint": {"greedy_accuracy": 0.6}, "null": {"greedy_accuracy": 0.47}}
    header, row = run.format_side_by_side(before, after, "512 held-out").splitlines()
    assert header.split() == [
        "512",
        "held-out",
        "joint",
        "before",
        "after",
        "change",
        "null",
        "before",
        "after",
        "change",
    ]
    assert row.split() == ["greedy_accuracy", "0.500", "0.600", "+0.100", "0.480", "0.470", "-0.010"]


def test_the_demo_prints_what_each_phase_did_to_the_other_role(tmp_path):
    import json

    for name, other in [
        ("stage-0-policy-es", {"rubric_valid_rate": {"start": 1.0, "after": 0.25}}),
        ("stage-1-rubric-es", {}),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "phase.json").write_text(json.dumps({"other_role": other}))
    assert run.other_role_lines(tmp_path) == [
        "  stage-0-policy-es: rubric_valid_rate 1.000 -> 0.250",
        "  stage-1-rubric-es: not measured",
    ]


@pytest.mark.slow
def test_the_demo_prints_the_gates_then_trains_both_arms_side_by_side(tmp_path):
    """`run_evolm_demo` end to end, at a tiny size, the two arms in two processes."""
    settings = replace(EVOLM_DEMO, rounds=1, policy_steps=1, rubric_steps=1, population_size=4, prompts_per_step=8)
    settings = replace(settings, rubric_population_size=4, rubric_prompts_per_step=2, num_train=32, num_held_out=16)
    settings = replace(settings, pair_weights={"temporal": 1.0, "inferred": 1.0, "rubric_conditioned": 1.0})
    printed = []
    result = run.run_evolm_demo(str(tmp_path), settings, seed=0, log=printed.append, processes=2)
    text = "\n".join(printed)
    assert text.index("Gates, before any training (256 training questions") < text.index("Training joint, null (2")
    assert all(gate.passed for gate in result.gates) and len(result.gates) == 7
    assert set(result.before) == set(result.after) == {"joint", "null"}
    assert "stage-0-policy-es: rubric_valid_rate" in text and "16 held-out" in printed[-2]
    assert all(0 <= result.after[name]["greedy_accuracy"] <= 1 for name in result.after)
