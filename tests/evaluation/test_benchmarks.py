"""The math benchmarks read from local files in their public formats (tests/fixtures/benchmarks/), and the
math-verify checker."""

import json
import re

import pytest
from scripts.paths import REPO

from trl_es.evaluation.benchmarks import BENCHMARKS, SYSTEM_PROMPT, last_boxed, load_benchmark, math_verify_judge
from trl_es.evaluation.comparison import load_eval_dataset
from trl_es.evaluation.metrics import maj_at_k

FIXTURES = REPO / "tests" / "fixtures" / "benchmarks"

# benchmark -> (fixture file, the gold answers its loader must read)
EXPECTED = {
    "gsm8k": ("gsm8k.parquet", ["14", "12", "14", "360", "2300"]),
    "math500": ("math500.jsonl", ["\\frac{1}{2}", "7", "\\left( 4, \\frac{3 \\pi}{2} \\right)", "12", "25\\pi"]),
    "aime": ("aime2024.jsonl", ["50", "2540", "1", "156", "30"]),
    "amc": ("amc.jsonl", ["6", "17", "51", "11", "192"]),
    "minerva": ("minerva.jsonl", ["10", "2", "10^{-10}", "3 e^{-2t}", "4"]),
    "olympiadbench": ("olympiadbench.jsonl", ["2,3", "400", "70", "4", "\\frac{3}{8}"]),
}


def test_every_benchmark_has_a_fixture():
    assert set(EXPECTED) == set(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_loader_reads_its_release_columns_and_gold_answers(name):
    file, golds = EXPECTED[name]
    prompts, references = load_benchmark(name, FIXTURES / file)
    assert references == golds
    assert len(prompts) == 5 and all(prompt[0] == {"role": "system", "content": SYSTEM_PROMPT} for prompt in prompts)
    assert all(prompt[1]["role"] == "user" and len(prompt[1]["content"]) > 20 for prompt in prompts)


def test_the_cli_syntax_name_colon_path_gives_a_math_verified_dataset():
    dataset = load_eval_dataset(f"math500:{FIXTURES / 'math500.jsonl'}", num_problems=3)
    assert dataset.name == "math500" and len(dataset.prompts) == 3 and dataset.max_new_tokens == 1024
    assert dataset.judge is not None and dataset.extract_answer("so \\boxed{0.5}") == "1/2"


def test_lowercase_aime_releases_load_too(tmp_path):
    path = tmp_path / "aime2025.jsonl"
    path.write_text(json.dumps({"id": "2025-I-1", "problem": "Find $2 + 2$.", "answer": "4"}) + "\n")
    assert load_benchmark("aime", path)[1] == ["4"]


def test_a_math500_file_without_answer_takes_the_last_boxed_of_the_solution(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "p", "solution": "First $\\boxed{1}$, then $\\boxed{\\frac{2}{3}}$."}))
    assert load_benchmark("math500", path)[1] == ["\\frac{2}{3}"]
    assert last_boxed("no box") is None and last_boxed("\\boxed{a{b}c} end") == "a{b}c"


def test_an_unknown_benchmark_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown benchmark 'math5000'.*gsm8k, math500, aime, amc, minerva"):
        load_eval_dataset(f"math5000:{FIXTURES / 'math500.jsonl'}")


def test_a_file_missing_its_columns_is_refused_naming_the_columns_and_the_fix():
    message = re.escape("has columns ['question', 'answer'], but math500 needs a problem column `problem`")
    with pytest.raises(ValueError, match=message + r".*point `math500:PATH` at a file in that format"):
        load_eval_dataset(f"math500:{FIXTURES / 'gsm8k.parquet'}")


def test_a_missing_benchmark_file_is_refused_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k:.*missing.jsonl: no such file"):
        load_eval_dataset(f"gsm8k:{tmp_path / 'missing.jsonl'}")


# The checker


def verdict(gold: str, *completions: str):
    return math_verify_judge([gold])(0, list(completions), [[] for _ in completions])


def test_a_correct_boxed_answer_counts_and_a_wrong_one_does_not():
    found = verdict("2540", "so $a^3+b^3=\\boxed{2540}$.", "the answer is \\boxed{2541}", "I do not know")
    assert found.correct == [True, False, False]


@pytest.mark.parametrize(
    "gold, completion",
    [
        ("\\frac{1}{2}", "\\boxed{0.5}"),
        ("0.5", "\\boxed{\\frac{1}{2}}"),
        ("25\\pi", "\\boxed{25 \\pi}"),
        ("\\left( 4, \\frac{3 \\pi}{2} \\right)", "\\boxed{(4, 3\\pi/2)}"),
        ("2300", "\\boxed{2,300}"),
        ("2,3", "\\boxed{3, 2}"),  # OlympiadBench's multiple answers: a set
    ],
)
def test_an_equivalent_form_counts_where_math_verify_says_so(gold, completion):
    assert verdict(gold, completion).correct == [True]


def test_right_answers_vote_as_one_class_whatever_their_form():
    found = verdict(
        "\\frac{1}{2}", "\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{3}", "\\boxed{3}", "\\boxed{1/2}"
    )
    assert found.answers == ["\\frac{1}{2}", "\\frac{1}{2}", "3", "3", "\\frac{1}{2}"]
    assert maj_at_k(found.answers, found.reference, 5) == 1.0  # three right forms outvote the two 3s
