"""The rubric lab's models: the joint and null arms of each pretraining seed, and their gates.

Pretraining seed 0 is the pair the demo ships (`trl_es/demo/evolm/{joint,null}`, `pretrain_arms --seed 0`); every
other seed is pretrained by `trl_es.demo.evolm.pretrain_arms` with the same recipe into `<work_dir>/arms/seed<k>`
(about an hour of one core), once: a folder that holds both arms is reused.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from experiments.rubric_lab.settings import RubricLabSettings
from trl_es.demo.evolm.settings import DEMO_MODELS

SHIPPED_SEED = 0


def arm_folders(pretraining_seed: int, work_dir: str | Path) -> dict[str, Path]:
    """`{"joint": folder, "null": folder}` of `pretraining_seed`, pretrained first where the work folder lacks them."""
    if pretraining_seed == SHIPPED_SEED:
        return dict(DEMO_MODELS)
    folder = Path(work_dir) / "arms" / f"seed{pretraining_seed}"
    arms = {name: folder / name for name in DEMO_MODELS}
    if not all((path / "model.safetensors").is_file() for path in arms.values()):
        from trl_es.demo.evolm.pretrain_arms import pretrain_arms

        return pretrain_arms(folder, seed=pretraining_seed)
    return arms


def lab_gates(settings: RubricLabSettings, work_dir: str | Path, log=print) -> dict[str, dict]:
    """Every pretraining seed's gates, measured before any job on the demo's training questions (at least its 256,
    of which the jobs train on the first `num_train`); a failed gate stops the lab before it trains anything."""
    from trl_es.demo.evolm.gates import GateFailure, check_gates, format_gates
    from trl_es.demo.evolm.run import measure_gates
    from trl_es.demo.evolm.settings import EVOLM_DEMO

    questions = max(settings.demo.num_train, EVOLM_DEMO.num_train)
    measured_gates, found_gates = {}, {}
    for seed in settings.pretraining_seeds:
        measured, found = measure_gates(settings.demo, arm_folders(seed, work_dir))
        log(
            f"[rubric-lab] gates of pretraining seed {seed}, on {questions} training questions:\n{format_gates(found)}"
        )
        measured_gates[str(seed)] = {"measured": measured, "gates": [asdict(gate) for gate in found]}
        found_gates[seed] = found
    for seed, found in found_gates.items():  # every seed's gates are printed before any refusal
        try:
            check_gates(found)
        except GateFailure as failure:
            raise GateFailure(f"Pretraining seed {seed}: {failure}") from None
    return {"num_questions": questions, "by_pretraining_seed": measured_gates}
