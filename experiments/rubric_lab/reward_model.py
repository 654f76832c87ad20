"""The `scalar-rm` baseline's reward model: Bradley–Terry, from the judge's weights, trained on pairs built from the
starting model's own outputs; and its score as a reward function."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from experiments.rubric_lab.settings import NO_TEMPORAL, RubricLabSettings


def rm_text(question: str, answer: str) -> str:
    return f"Question: {question}\nAnswer:{answer}"


def train_reward_model(settings: RubricLabSettings, start: Path, seed: int, folder: Path) -> Path:
    """A Bradley–Terry reward model from the judge's weights, on pairs built from `start`'s own outputs (inferred
    question and rubric-conditioned, as the `sequential` method's first rubric phase builds them)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from trl_es.core.noise import derive_seed
    from trl_es.demo.evolm.run import JUDGE_MODEL, sample_completions
    from trl_es.demo.evolm.toy import DEMO_PROMPTS, question_dataset
    from trl_es.evolm.pairs import PairMixture, ReplayBuffer

    demo = settings.demo
    policy, policy_tokenizer = AutoModelForCausalLM.from_pretrained(start).eval(), AutoTokenizer.from_pretrained(start)
    calls = iter(range(1_000_000))

    def generate(texts: list[str]) -> list[str]:  # sampled at temperature 1, as EvolmTrainer builds its pairs
        seed_of_call = derive_seed(seed, "reward-model-pairs", next(calls))
        return sample_completions(policy, policy_tokenizer, texts, 1.0, demo.max_completion_length, seed_of_call)

    questions = list(question_dataset("train", demo.num_train)["question"])
    answers = generate([DEMO_PROMPTS.policy.format(question=q) for q in questions])
    rubrics = generate([DEMO_PROMPTS.rubric_generation.format(question=q) for q in questions])
    pairs, _ = PairMixture(NO_TEMPORAL).build(
        questions, answers, rubrics, generate, ReplayBuffer(), 0, seed, DEMO_PROMPTS
    )
    tokenizer = AutoTokenizer.from_pretrained(JUDGE_MODEL)
    model = AutoModelForSequenceClassification.from_pretrained(JUDGE_MODEL, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(settings.rm_steps):
        batch = [pairs[i] for i in torch.randint(len(pairs), (32,), generator=generator).tolist()]
        chosen = rm_scores(model, tokenizer, [rm_text(p.question, p.chosen) for p in batch])
        rejected = rm_scores(model, tokenizer, [rm_text(p.question, p.rejected) for p in batch])
        loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "pairs.json").write_text(json.dumps({"pairs": len(pairs), "final_loss": loss.item()}))
    return folder


def rm_scores(model, tokenizer, texts: list[str]) -> torch.Tensor:
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    return model(**batch).logits[:, 0]


def reward_model_reward(folder: Path):
    """The reward model's score of each completion (TRL's reward-function contract)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    @torch.no_grad()
    def reward_model_reward(prompts, completions, question, **kwargs) -> list[float]:
        texts = [rm_text(q, c) for q, c in zip(question, completions, strict=True)]
        return rm_scores(model, tokenizer, texts).tolist()

    return reward_model_reward
