#!/usr/bin/env bash
# The GPU check: `make bench`'s RESULT keys measured on one GPU, where users run (issue 17). Under 8 minutes on one
# H200: a random ~0.5B Qwen2 (Qwen2.5-0.5B's shape) built locally, bf16, N=8, B=128 prompts, T=128 tokens, the HF
# generation path, peak memory by torch.cuda.max_memory_allocated (benchmarks/bench.py --preset gpu).
#
#   bash benchmarks/gpu_check.sh                        # on the GPU machine
#   bash benchmarks/gpu_check.sh --sections speed       # any bench.py flag after the preset's
#   bash benchmarks/gpu_check.sh --device cpu --preset tiny   # the same path on CPU in seconds (tests/test_gpu_check.py)
#
# The GPU machine has Python 3.12, torch, transformers, accelerate and peft, but neither TRL nor datasets, and no
# network. Before the run, every package of .whl/ (filled by `make gpu-wheels` on a machine with a package index)
# whose module that Python cannot import is installed, without dependencies, into a private directory put first on
# PYTHONPATH; nothing is installed into the machine's own site-packages. trl_es runs from this working tree.
# Environment: PYTHON (default python3), WHEELS (default .whl), GPU_CHECK_LOG (also write the output there),
# GPU_CHECK_PACKAGES (the module:wheel pairs to check, space-separated).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
# module:wheel name of everything TRL needs that a PyTorch image may lack
PACKAGES=${GPU_CHECK_PACKAGES:-trl:trl datasets:datasets dill:dill multiprocess:multiprocess pyarrow:pyarrow pandas:pandas xxhash:xxhash}

site=$(mktemp -d "${TMPDIR:-/tmp}/trl-es-gpu-check-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
missing=()
for entry in $PACKAGES; do
    module=${entry%%:*}
    if ! "$PYTHON" -c "import $module" >/dev/null 2>&1; then
        missing+=("${entry#*:}")
    fi
done
if ((${#missing[@]})); then
    wheels=()
    for name in "${missing[@]}"; do
        found=$(ls "$WHEELS"/"$name"-[0-9]*.whl 2>/dev/null | head -n 1 || true)
        if [[ -z $found ]]; then
            echo "gpu_check: $PYTHON cannot import $name and $WHEELS/ has no wheel of it. Run 'make gpu-wheels' on a" \
                "machine with a package index and bring $WHEELS/ along (missing here: ${missing[*]})." >&2
            exit 2
        fi
        wheels+=("$found")
    done
    echo "gpu_check: installing ${missing[*]} from $WHEELS/ into $site"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! problem=$("$PYTHON" -c "import trl, datasets, trl_es.trainer.es_trainer" 2>&1); then
    echo "gpu_check: the environment cannot import TRL and trl_es:" >&2
    echo "$problem" | tail -n 5 >&2
    exit 2
fi
if [[ -n ${GPU_CHECK_LOG:-} ]]; then
    "$PYTHON" benchmarks/bench.py --preset gpu "$@" 2>&1 | tee "$GPU_CHECK_LOG"
else
    "$PYTHON" benchmarks/bench.py --preset gpu "$@"
fi
