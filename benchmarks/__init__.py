"""ES vs GRPO memory, ES overhead over generation, low-rank, vLLM and processes, measured side by side in one run.

    python benchmarks/bench.py                    # users' regime on 2 CPU cores (~20 min): 30M model, N=8, B=64, T=16
    python benchmarks/bench.py --preset quick     # the same sections on smaller settings (a few minutes)
    python benchmarks/bench.py --preset full      # larger model, populations and batches
    python benchmarks/bench.py --output bench.json   # also write the RESULT JSON (with date and command) to a file
    bash benchmarks/gpu_check.sh                  # --preset gpu on one GPU: a 0.5B Qwen2, bf16, B=128, T=128

Everything runs offline on random Qwen2 models built locally (byte-level BPE tokenizer trained here, vocabulary 320;
the 0.5B preset has Qwen2.5-0.5B's shape, vocabulary 151,936 included), with sampling at temperature 1, a dense toy
reward (the fraction of even token ids) and `min_new_tokens = max_completion_length`, so every completion has exactly
T tokens. B is prompts per step, T completion tokens, N the population (GRPO: the group size); both methods generate
N x B completions per step. Per member, ES writes the weights and applies its share of the update at a cost that grows
with the parameters P, while generating costs P x B x T: the overhead of ES over generation falls as 1 / (B x T), which
is why the headline figures use B x T >= 1,000 and section 2 prints the whole curve.

Sections (`--sections`; each module's docstring says how it measures):
1. memory (`benchmarks/sections/memory.py`): peak memory of ES and GRPO training the same model, one fresh process
   per run, in a float32, a bf16 and two low-rank setups: `memory_ratio_*`.
2. speed (`overhead.py`): an ES step vs `model.generate` of the same calls, interleaved, medians, against B x T:
   `overhead_ratio_es_over_generation` (and `..._small_batch`); `time_ratio_es_over_grpo_per_step` from GRPO's
   memory runs.
3. lowrank (`lowrank.py`): full-rank and low-rank ES steps vs one batched generate of the same N x B rows:
   `lowrank_ratio_over_batched_generation`.
4. vllm (`vllm.py`): `benchmarks/vllm_es_overhead.py` at the users' N, B and T: `vllm_overhead_ratio`.
5. processes (`processes.py`): `benchmarks/population_parallel.py`, 2 processes over 1: `speedup_2_processes` (and
   `speedup_2_processes_unsharded_update`, with `shard_update=False`, side by side).
6. scale (`scale.py`, not run by default): ES seconds per step against population size, prompt batch and model size.
7. colocate_memory (`colocate_memory.py`, not run by default): peak memory of an ES process with a colocated vLLM
   engine minus that of the same engine generating alone, per parameter, bf16 model:
   `memory_bytes_per_param_es_colocate` (float32 master), `..._compensated` (`compensated_bfloat16`) and
   `..._offloaded` (`offload_master=True`).
8. servers (`servers.py`, not run by default): `benchmarks/server_pool_speedup.py`, ES steps per second with
   `vllm_mode="server"` over 2 `trl-es vllm-serve` servers / 1: `speedup_2_servers`.
9. tensor_parallel (`tensor_parallel.py`, not run by default): `benchmarks/population_parallel.py` with colocated vLLM,
   2 processes sharing one engine (`vllm_tensor_parallel_size=2`) / 1 process with its own, seconds per ES step:
   `tp2_over_tp1_step_time_ratio`.

On CPU every process uses one torch thread unless `--threads` says otherwise: on a shared machine, OpenMP threads
that wait for each other while other processes hold the cores slowed generation 5-10x at random in our runs.

The last line is `RESULT <json>` with every ratio (null, with the reason under `skipped`, for a section that did not
run), the raw numbers, the settings and the machine. `benchmarks/harness.py` holds what every benchmark shares.
"""
