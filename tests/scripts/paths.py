"""Where things are, for tests in any folder of tests/: the repository, tests/scripts/ and the example configs."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"
EXAMPLES = REPO / "examples"
ACCELERATE_CONFIGS = EXAMPLES / "accelerate_configs"
