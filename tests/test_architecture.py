"""The package's structure: floors that import only downwards and never in a circle (package faces included), every
private name of the libraries ES builds on used only in the compat wing (`trl_es/compat/`), public names at the top
level, and every backend implementing the population protocol."""

import ast
import importlib
import inspect
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import trl_es

PACKAGE = Path(trl_es.__file__).parent
COMPAT = "trl_es.compat"
# The libraries whose private names only the compat wing may use.
LIBRARIES = frozenset(
    {"trl", "transformers", "accelerate", "vllm", "torch", "datasets", "huggingface_hub", "peft", "deepspeed"}
)

# The floors, from the ground up: a module imports only modules of its own floor or of floors below it.
FLOORS = (
    ("trl_es._version", "trl_es.compat"),
    ("trl_es.core", "trl_es.tasks", "trl_es.testing"),
    ("trl_es.backends", "trl_es.agents"),
    ("trl_es.evaluation",),
    ("trl_es.trainer",),
    ("trl_es.sequential",),
    ("trl_es.evolm",),
    ("trl_es.demo",),
    ("trl_es.cli",),
    ("trl_es",),  # the package face: its lazy exports reach every floor, and no module imports it
)
# A namedtuple's public methods start with an underscore so that they cannot clash with its fields.
PUBLIC_UNDERSCORE_NAMES = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


# Reading the package.


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, `__init__.py` files as their package's name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def tree(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text())


def absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an `ImportFrom` names, with relative imports resolved against `module`."""
    if not node.level:
        return node.module or ""
    here = module.split(".") if modules()[module].name == "__init__.py" else module.split(".")[:-1]
    base = here[: len(here) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(module: str) -> set[str]:
    """The package modules `module` imports anywhere in the file (function-level imports included); `from X import
    name` counts as importing `X.name` where that is a module. The face's lazy exports count as its imports."""
    found = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, node)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in modules() and target != module}
    if module == "trl_es":
        found |= set(trl_es._EXPORTS.values())
    return found


def floor(module: str) -> int:
    """The floor of the longest prefix of `module` that `FLOORS` names."""
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(FLOORS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is on no floor: add its folder to FLOORS in {__file__}"
    return max(matches)[1]


def graph() -> dict[str, set[str]]:
    return {module: imported_modules(module) for module in modules()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it."""
    found, done = [], set()

    def visit(module, stack):
        if module in stack:
            found.append(stack[stack.index(module) :] + [module])
            return
        if module in done:
            return
        for target in sorted(edges[module]):
            visit(target, stack + [module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    return found


# Private names.


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE_NAMES


def library_of(dotted: str) -> str | None:
    root = dotted.split(".")[0]
    return root if root in LIBRARIES else None


@cache
def own_private_names() -> frozenset[str]:
    """The private names the package defines outside the compat wing: functions, classes, module and class
    attributes, and attributes it assigns (`self._x = ...`)."""
    names = set()
    for module in modules():
        if module.startswith(COMPAT):
            continue
        for node in ast.walk(tree(module)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Name):
                            names.add(part.id)
                        elif isinstance(part, ast.Attribute):
                            names.add(part.attr)
    return frozenset(name for name in names if is_private(name))


@cache
def private_names_of(cls: type) -> frozenset[str]:
    """The private names a library class and its library bases define: class attributes and methods, and the
    attributes their methods assign (`self._x = ...`)."""
    names = set()
    for base in cls.__mro__:
        if library_of(base.__module__) is None:
            continue
        names |= {name for name in vars(base) if is_private(name)}
        try:
            source = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        names |= {name for name in re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]+)?=", source) if is_private(name)}
    return names


@cache
def library_private_names() -> frozenset[str]:
    """The private names of the library classes ES builds on: its trainers' bases, and the objects it is handed."""
    import transformers
    import trl
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    classes = [trl.GRPOTrainer, trl.GRPOConfig, transformers.PreTrainedModel, transformers.PretrainedConfig]
    classes += [Accelerator, AcceleratorState, *library_bases_of_package_classes()]
    return frozenset(name for cls in classes for name in private_names_of(cls))


def package_classes() -> list[tuple[str, type]]:
    found = []
    for module in modules():
        loaded = importlib.import_module(module)
        found += [(module, cls) for cls in vars(loaded).values() if inspect.isclass(cls) and cls.__module__ == module]
    return found


def library_bases_of_package_classes() -> set[type]:
    return {base for _, cls in package_classes() for base in cls.__mro__[1:] if library_of(base.__module__)}


def library_import_names(module: str) -> set[str]:
    """The names a module binds by importing a library (or something of a library)."""
    names = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names if library_of(alias.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and library_of(node.module or ""):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def private_uses(module: str) -> list[str]:
    """Where `module` uses a library's private name, or patches a library: `"line: what"`.

    `self._x` inside one of the package's classes is the class's own unless a library base of the class has `_x`;
    `other._x` is a library's unless the package defines `_x` and no library class ES builds on has it."""
    found = []
    patched_roots = library_import_names(module)
    try:
        loaded = importlib.import_module(module)
    except ImportError:  # the scratch module of the check's own test
        loaded = None

    def inherited(class_name: str | None) -> set[str]:
        cls = getattr(loaded, class_name, None) if class_name else None
        if not inspect.isclass(cls):
            return set()
        return set().union(*(private_names_of(base) for base in cls.__mro__[1:] if library_of(base.__module__)))

    def library_name(name: str) -> bool:
        return name not in own_private_names() or name in library_private_names()

    def visit(node: ast.AST, class_name: str | None) -> None:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ClassDef):
            class_name = node.name
        elif isinstance(node, ast.Import):
            found.extend(
                f"{line}: import {alias.name}"
                for alias in node.names
                if library_of(alias.name) and has_private_part(alias.name)
            )
        elif isinstance(node, ast.ImportFrom) and not node.level and library_of(node.module or ""):
            private = [alias.name for alias in node.names if is_private(alias.name)]
            if private or has_private_part(node.module):
                found.append(f"{line}: from {node.module} import {', '.join(private) or '...'}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver in ("self", "cls") and class_name is not None:
                if node.attr in inherited(class_name) or node.attr not in own_private_names():
                    found.append(f"{line}: {receiver}.{node.attr}")
            elif library_name(node.attr):
                found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            function, (target, attribute) = node.func.id, node.args[:2]
            if function in ("getattr", "setattr", "hasattr", "delattr"):
                name = attribute.value if isinstance(attribute, ast.Constant) else None
                if isinstance(name, str) and is_private(name) and library_name(name):
                    found.append(f"{line}: {function}(..., {name!r})")
                if function in ("setattr", "delattr") and root_name(target) in patched_roots:
                    found.append(f"{line}: {function} on {root_name(target)} (patches a library)")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and root_name(target) in patched_roots:
                    found.append(f"{line}: {ast.unparse(target)} = ... (patches a library)")
        for child in ast.iter_child_nodes(node):
            visit(child, class_name)

    visit(tree(module), None)
    return sorted(set(found), key=lambda use: int(use.split(":")[0]))


def has_private_part(dotted: str) -> bool:
    return any(is_private(part) for part in dotted.split("."))


# The tests.


def test_every_module_stands_on_a_floor():
    for module in modules():
        floor(module)


def test_no_module_imports_a_module_of_a_higher_floor():
    upward = [
        f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
        for module, targets in graph().items()
        for target in sorted(targets)
        if floor(target) > floor(module)
    ]
    assert not upward, "imports from a lower floor up to a higher one:\n" + "\n".join(upward)


def test_the_core_floor_imports_neither_trl_nor_transformers():
    """The processes that the distributed parts spawn need `trl_es.core` only; transformers alone would add seconds
    to the start of each."""
    core = [module for module in modules() if module.split(".")[:2] == ["trl_es", "core"]]
    imports = "; ".join(f"import {module}" for module in core)
    code = f"import sys; {imports}; print(sorted({{'trl', 'transformers'}} & set(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", f"importing trl_es.core imported {run.stdout.strip()}"


def test_no_module_of_the_package_imports_itself_in_a_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in found)


def test_the_cycle_check_sees_package_faces():
    edges = {"trl_es.backends.vllm_worker": {"trl_es"}, "trl_es": {"trl_es.backends.vllm_worker"}}
    assert circles(edges) == [["trl_es", "trl_es.backends.vllm_worker", "trl_es"]]
    assert "trl_es.backends" in modules() and floor("trl_es") > floor("trl_es.backends.vllm_worker")


def test_no_module_outside_the_compat_wing_uses_a_private_name_of_a_library():
    offenders = {
        module: uses for module in modules() if not module.startswith(COMPAT) and (uses := private_uses(module))
    }
    assert not offenders, "private names of TRL, vLLM, Accelerate, transformers or torch outside trl_es/compat/:\n" + (
        "\n".join(
            f"{modules()[module].relative_to(PACKAGE.parent)}:{use}"
            for module, uses in offenders.items()
            for use in uses
        )
    )


def test_no_class_outside_the_compat_wing_overrides_a_private_name_of_its_library_base():
    offenders = []
    for module, cls in package_classes():
        if module.startswith(COMPAT):
            continue
        inherited = set().union(*(private_names_of(base) for base in cls.__mro__[1:] if library_of(base.__module__)))
        source = inspect.getsource(cls)
        own = {name for name in vars(cls) if is_private(name)}
        own |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]+)?=", source))
        offenders += [f"{module}.{cls.__name__}.{name}" for name in sorted(own & inherited)]
    assert not offenders, f"private names of a library base class overridden outside trl_es/compat/: {offenders}"


@pytest.mark.parametrize(
    "line",
    [
        "trainer._metrics['train']",
        "from trl.trainer.utils import _private",
        "getattr(model.config, '_name_or_path', None)",
        "torch.distributed.destroy_process_group = None",
        "AcceleratorState._reset_state()",
    ],
)
def test_the_private_name_check_finds(line, tmp_path, monkeypatch):
    source = f"import torch\nfrom accelerate.state import AcceleratorState\n\n\ndef f(trainer, model):\n    {line}\n"
    monkeypatch.setitem(modules(), "trl_es.scratch", tmp_path / "scratch.py")
    (tmp_path / "scratch.py").write_text(source)
    tree.cache_clear()
    try:
        assert private_uses("trl_es.scratch"), line
    finally:
        tree.cache_clear()


def test_every_compat_function_lists_its_private_names_and_has_a_test():
    tests = "\n".join(path.read_text() for path in (Path(__file__).parent / "compat").glob("test_*.py"))
    for module in [name for name in modules() if name.startswith(COMPAT + ".")]:
        loaded = importlib.import_module(module)
        source = inspect.getsource(loaded)
        assert loaded.PRIVATE_NAMES, module
        for function, names in loaded.PRIVATE_NAMES.items():
            assert callable(getattr(loaded, function)), (module, function)
            for name in names:
                assert name.split(" ")[0].rsplit(".", 1)[-1] in source, (module, function, name)
            assert re.search(rf"\b{function}\b", tests), f"no test in tests/compat/ uses {module}.{function}"


def test_the_es_trainer_generates_members_without_grpo_private_generation():
    source = (PACKAGE / "trainer" / "es_trainer.py").read_text()
    assert "self._generate(" not in source
    assert "def _generate_single_turn" not in source
    assert "_generate_and_score_completions" not in source


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
    assert set(trl_es.__all__) == set(trl_es._EXPORTS) | {"__version__"}


def test_every_backend_implements_the_population_backend_protocol():
    from trl_es.backends.base import PopulationBackend
    from trl_es.backends.hf import HFBackend
    from trl_es.backends.hf_lowrank import HFLowRankBackend
    from trl_es.backends.vllm_colocate import VLLMColocateBackend
    from trl_es.backends.vllm_lora import VLLMLoRAPopulationBackend
    from trl_es.backends.vllm_server import VLLMServerBackend
    from trl_es.backends.vllm_server_pool import VLLMServerPool

    backends = (HFBackend, HFLowRankBackend, VLLMColocateBackend, VLLMLoRAPopulationBackend, VLLMServerBackend)
    methods = [name for name in dir(PopulationBackend) if not name.startswith("_")]
    assert set(methods) >= {"generate", "generate_center", "after_update", "check_consistency"}
    for backend in (*backends, VLLMServerPool):
        missing = [name for name in methods if name != "master" and not callable(getattr(backend, name, None))]
        assert not missing, (backend.__name__, missing)
