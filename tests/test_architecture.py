"""The package's structure: no import cycles, member generation owned by ES, TRL privates in one module, public names
at the top level."""

import ast
import re
from pathlib import Path

import trl_es

PACKAGE = Path(trl_es.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `module` imports (anywhere in the file, function-level imports included)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != module and modules[t].name != "__init__.py"}
    return found


def test_no_module_of_the_package_imports_itself_in_a_circle():
    modules = _modules()
    graph = {module: _imports(module, path, modules) for module, path in modules.items()}
    cycles = []

    def visit(module, stack):
        if module in stack:
            cycles.append(stack[stack.index(module) :] + [module])
            return
        if module in done:
            return
        for target in graph[module]:
            visit(target, stack + [module])
        done.add(module)

    done: set[str] = set()
    for module in graph:
        visit(module, [])
    assert not cycles, f"import cycles: {cycles}"


def test_the_es_trainer_generates_members_without_grpo_private_generation():
    source = (PACKAGE / "trainer" / "es_trainer.py").read_text()
    assert "self._generate(" not in source
    assert "def _generate_single_turn" not in source
    assert "_generate_and_score_completions" not in source


def test_trl_private_names_are_used_only_in_trl_compat():
    private = re.compile(
        r"\._calculate_rewards|\._metrics\b|\._logs\b|\._pending_metrics|\._pending_extra_logs|_last_loaded_step"
        r"|vllm_generation\.LLM"
    )
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "trl_compat.py" and private.search(path.read_text())
    ]
    assert not offenders, f"TRL private names outside trl_es/trl_compat.py: {offenders}"


def test_public_names_are_importable_from_the_top_level():
    from trl_es import (  # noqa: F401
        CoverageEvalCallback,
        CoverageReport,
        ESConfig,
        ESTrainer,
        EvolmConfig,
        EvolmTrainer,
        PopulationBackend,
        SequentialTrainer,
        Stage,
        coverage_report,
        js_diversity,
        maj_at_k,
        pass_at_k,
    )

    assert set(trl_es.__all__) >= {"ESConfig", "ESTrainer", "SequentialTrainer", "Stage", "CoverageEvalCallback"}


def test_every_backend_implements_the_population_backend_protocol():
    from trl_es.backends.base import PopulationBackend
    from trl_es.backends.hf import HFBackend
    from trl_es.backends.hf_lowrank import HFLowRankBackend
    from trl_es.backends.vllm_colocate import VLLMColocateBackend
    from trl_es.backends.vllm_lora import VLLMLoRAPopulationBackend
    from trl_es.backends.vllm_server import VLLMServerBackend

    methods = [name for name in dir(PopulationBackend) if not name.startswith("_")]
    assert set(methods) >= {"generate", "generate_center", "after_update", "check_consistency"}
    for backend in (HFBackend, HFLowRankBackend, VLLMColocateBackend, VLLMLoRAPopulationBackend, VLLMServerBackend):
        missing = [name for name in methods if name != "master" and not callable(getattr(backend, name, None))]
        assert not missing, (backend.__name__, missing)
