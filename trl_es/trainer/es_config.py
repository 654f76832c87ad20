"""ESConfig: GRPOConfig's fields plus the Evolution Strategies hyperparameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..backends.server_urls import server_urls
from ..compat.trl import one_completion_per_prompt_accepted
from ..core.direction_optimizer import ES_OPTIMIZERS
from ..core.fitness import FITNESS_SHAPINGS
from ..core.lowrank import OTHER_PARAMETERS
from ..core.sigma_schedule import SIGMA_SCHEDULES
from .config_checks import PERTURBATIONS, check_after_grpo, check_before_grpo, import_function
from .grpo_conversion import es_overrides_of
from .redaction import SettingsWithoutSecrets


# What leaves the process holds no secret (`SettingsWithoutSecrets`: the pickle in `training_args.bin`, what loggers
# record, the printed config); `repr=False` keeps the mixin's `__repr__`.
@dataclass(repr=False)
class ESConfig(SettingsWithoutSecrets, GRPOConfig):
    r"""
    Configuration class for the [`ESTrainer`].

    Subclasses [`~trl.GRPOConfig`], so every GRPO field (generation, vLLM, rewards, logging and
    [`~transformers.TrainingArguments`]) keeps its name and meaning. Fields that only shape GRPO's loss (`beta`,
    `epsilon`, `loss_type`, `num_iterations`, ...) are accepted and ignored, with a warning when set; the config keeps
    the values given, but `ESTrainer` builds no reference model whatever `beta` says (ES has no KL penalty).
    `steps_per_generation` (or `generation_batch_size`) other than `gradient_accumulation_steps` is converted to it,
    with a warning: ES makes one update per prompt batch.

    One ES step evaluates `population_size` perturbed copies of the model ("members") on the same prompt batch, scores
    each member by its mean reward, shapes the scores and moves the parameters by
    `learning_rate * (1/N) * sum_i z_i * eps_i`. The `1/sigma` of the gradient estimate is folded into `learning_rate`
    (Qiu et al., arXiv 2509.24372).

    Parameters:
        > Evolution Strategies

        population_size (`int`, *optional*, defaults to `30`):
            Number of perturbed members evaluated per ES step (N). Smaller populations suffice for larger models
            (N=16 is within 0.01 reward of N=64 at 1.5B/3B parameters, arXiv 2608.27351).
        sigma (`float`, *optional*, defaults to `1e-3`):
            Standard deviation of the Gaussian parameter noise (its value at the first step, when it changes).
        sigma_schedule (`str`, *optional*, defaults to `"constant"`):
            How sigma moves over the run: `"constant"`, or from `sigma` at the first step to `sigma_final` at the last
            (`max_steps`), `"linear"`ly or along a half `"cosine"`. The update folds the estimate's `1/sigma` into
            `learning_rate`, so a schedule changes which members are compared, not the step's size.
        sigma_final (`float`, *optional*):
            Sigma at the last step of a `"linear"` or `"cosine"` `sigma_schedule`.
        sigma_target_js_diversity (`float`, *optional*):
            Adapt sigma to hold the population's JS diversity (`es/js_diversity`, in bits, in (0, 1]) near this
            target: after each step sigma is multiplied by `exp(sigma_adaptation_rate * e)`, with `e` the relative
            shortfall `(target - measured) / target` clipped to [-1, 1], and kept within a factor 10 of `sigma`. The
            paper ties JS diversity to Pass@K. The current sigma is logged as `es/sigma` and saved in checkpoints.
        sigma_adaptation_rate (`float`, *optional*, defaults to `0.1`):
            Largest change of log(sigma) per step with `sigma_target_js_diversity`.
        antithetic (`bool`, *optional*, defaults to `False`):
            Use mirrored pairs `(+eps, -eps)` (two-point estimator). Requires an even `population_size`. The source
            paper found no advantage over the one-point estimator on generated answers.
        fitness_shaping (`str`, *optional*, defaults to `"zscore"`):
            How member fitness is normalised before the update: `"zscore"` (paper), `"centered_rank"` (OpenAI ES) or
            `"none"` (mean-centred only). Equal fitness always gives a zero update.
        normalize_fitness_per_prompt (`bool`, *optional*, defaults to `False`):
            Standardise each prompt's rewards across the population (every member's completions of it) before they
            are averaged into a member's fitness, so that easy and hard prompts weigh the same (EGGROLL normalises
            per prompt group). A prompt every member scores the same on adds nothing.
        fitness_pass_at_k (`int`, *optional*):
            Score each member by its mean unbiased Pass@k over the step's prompts, from its `num_generations`
            completions of each (a success: weighted reward above `success_reward_threshold`), instead of its mean
            reward, so that ES climbs coverage itself. Needs `num_generations >= fitness_pass_at_k` (and
            `temperature > 0` for more than one completion per prompt). Logged rewards stay the rewards.
        es_optimizer (`str`, *optional*, defaults to `"sgd"`):
            What the update adds, `learning_rate` times: the ES direction itself (`"sgd"`, the anchor paper), its
            running sum with decay `es_momentum` (`"momentum"`), or Adam's normalised step with `adam_beta1`,
            `adam_beta2` and `adam_epsilon` (`"adam"`, the EGGROLL code); weight decay stays decoupled. The state is
            saved in every checkpoint and a resume continues it bitwise; with `shard_update` each process keeps the
            state of the tensors whose update it computes (1/P of it). Adam's entries are about `learning_rate` in
            size, `sqrt(population_size)` times plain ES's: lower `learning_rate` to match.
        es_momentum (`float`, *optional*, defaults to `0.9`):
            Decay of the running direction with `es_optimizer="momentum"`.
        perturbation (`str`, *optional*, defaults to `"full"`):
            `"full"`: each member perturbs every evolving parameter with full-rank Gaussian noise. `"lowrank"`
            (EGGROLL, arXiv 2511.16652): each `nn.Linear`/`nn.Embedding` weight gets `sigma * A @ B.T / sqrt(r)`
            with `A`, `B` of rank `lowrank_rank` drawn from the member's seed, and the whole population generates in
            one batched call: with `model.generate`, forward hooks add each row's own low-rank term (the weights are
            never written); with vLLM (colocate), each member is a LoRA adapter and only the decoder's Linear
            projections evolve (set `lowrank_other_parameters="frozen"`). The update is the full-rank sum of the
            members' low-rank terms.
        lowrank_rank (`int`, *optional*, defaults to `1`):
            Rank `r` of each member's perturbation of each matrix (EGGROLL uses 1).
        lowrank_other_parameters (`str`, *optional*, defaults to `"full"`):
            What the other evolving parameters (norm weights, biases) do with `perturbation="lowrank"`: `"full"`
            gets full-rank noise as full-rank members do (norm modules are re-run per member in the batch),
            `"frozen"` keeps them fixed (neither perturbed nor updated).
        population_batch_size (`int`, *optional*):
            With `perturbation="lowrank"`: how many members generate together in one call (each call has
            `population_batch_size x` the prompt batch's rows; with vLLM it is also the engine's number of LoRA slots).
            Defaults to all of a process's members; lower it if the batch does not fit in memory.
        kl_anchor_beta (`float`, *optional*, defaults to `0.0`):
            Weight of the KL anchor, which holds the model near the weights the run started from: a member's fitness
            is its mean reward minus `kl_anchor_beta` times its KL from those weights, per token, on a fixed probe
            (one completion of each probe prompt that the starting model sampled at temperature 1; k3 estimator of
            KL(start || member)). `0.0` turns it off. GRPO's `beta` stays ignored: it weighs a KL against
            normalised advantages, this one against rewards. Needs `model.generate` with full-rank members
            (`use_vllm=False`, `perturbation="full"`).
        kl_anchor_probe_size (`int`, *optional*, defaults to `32`):
            Prompts in the KL anchor's probe: the first ones of the training set, unless [`ESTrainer`] is given
            `kl_probe_prompts`.
        shard_update (`bool`, *optional*, defaults to `True`):
            With several processes, split the update's noise draws between them: each process computes the update
            direction of a share of the tensors (summing the members in the same order as one process would) and
            broadcasts it, so the weights stay bitwise the same as with one process. Each process then receives
            (P - 1)/P of the model in float32 per step; turn it off across machines whose network is slower than
            drawing `population_size` noises of the model again. In server mode the processes also split the master
            itself (each tensor's on its owner, about 1/P of it per process); turned off, each keeps all of it.
        master_dtype (`str`, *optional*, defaults to `"float32"`):
            How the master (the centre every member is drawn from and every update lands in) is stored: `"float32"`,
            8 bytes per parameter beside a bfloat16 model, or `"compensated_bfloat16"`, a bfloat16 value plus a
            bfloat16 residual that keeps what each update's rounding left out (4 bytes; about 16 significant bits,
            so steps below the weights' bfloat16 resolution still accumulate). Checkpoints store float32 either way.
            Not with `perturbation="lowrank"` or `vllm_mode="server"` (whose worker keeps a float32 master).
        offload_master (`bool`, *optional*, defaults to `False`):
            Keep the float32 master and the `es_optimizer` state in (page-locked) host memory instead of on the
            accelerator. Every value is still computed on the accelerator, one tensor at a time, so a run is bitwise
            the run without offloading; the price is copying the master to the accelerator for every member (4 bytes
            per parameter) and each update's tensors both ways. Not with `perturbation="lowrank"` or
            `master_dtype="compensated_bfloat16"`; a vLLM server's worker keeps its own master on its GPU.
        offload_model (`bool`, *optional*, defaults to `True`):
            When vLLM generates (`use_vllm=True`), keep the trainer's model in host memory: it is loaded there and
            never put on the accelerator whole (a model passed already on it moves to host memory when the population
            is built); the master is built on the accelerator one tensor at a time, and the members are evaluated by
            the engine, so the accelerator holds the engine and the master only. The model still follows the centre
            after every update (checkpoints, evaluation and callbacks read it there; with several processes only the
            one that saves keeps it, see [`ESTrainer`]) and stays in host memory after training
            (`trainer.model.to(device)` brings it back). Set `False` for a callback that runs the model on the
            accelerator.
        noise_seed (`int`, *optional*):
            Seed of the members' noise and of their shared sampling seeds; `seed` when unset. `SequentialTrainer`
            gives every ES stage after the first its own, so that stages do not replay each other's members.
        consistency_check_steps (`int`, *optional*, defaults to `1`):
            Every this many steps (and at the last one), check that the copies of the weights that generation reads
            (the vLLM engine in colocate mode, the master inside a vLLM server) agree with the trainer's master, and
            raise if not. The check hashes the master (server) or sums the engine's weights (colocate); its seconds
            are logged as `es/time/check`: raise this on large models where they show. 0 disables it.
        vllm_server_base_url (`str`, *optional*):
            With `vllm_mode="server"`: the `trl-es vllm-serve` server, e.g. `"http://10.0.0.1:8000"`, or several
            separated by commas. Each training process drives its own share of them, in order (with 4 servers and 2
            processes, process 0 the first two), and spreads its members over its share; a run ends with the same
            weights whatever the number of servers. Unset: `http://{vllm_server_host}:{vllm_server_port}`.
        vllm_server_secret_file (`str`, *optional*):
            With `vllm_mode="server"`: the file holding the control secret of the `trl-es vllm-serve` server (it
            prints where it wrote it; mode 0600, yours). Defaults to `$TRL_ES_SERVER_SECRET` if set, else the file
            the server writes for its port, `~/.cache/trl-es/vllm-server-<port>.secret`. With several servers, they
            share the file given here (start each with `--secret_file` naming it). The secret itself never goes in
            the config (configs are logged and saved).

        > The Hub

        hub_push_logs (`bool`, *optional*, defaults to `False`):
            Also push the TensorBoard logs (`runs/` in `output_dir`) with the model, at every push. Off, they stay on
            this machine: their folder and file names carry its host name. `training_args.bin` is never pushed; the
            config as the card and the loggers record it (`ESConfig.to_dict`) holds no token and names each local
            path by its last component.

        > Coverage evaluation (with an `eval_dataset`)

        eval_ks (`list[int]`, *optional*):
            The k of Pass@k and Maj@k. When set, every evaluation also samples `max(eval_ks)` completions of each
            eval prompt from the centre (not a perturbed member), through vLLM when training uses it, and logs
            `eval_pass@k`, `eval_maj@k`, `eval_greedy_accuracy` and `eval_entropy` (mean token entropy, nats).
        eval_temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of those completions (greedy accuracy is measured separately).
        eval_answer_extractor (`str`, *optional*):
            Import path of a function from completion text to answer (None when there is none), e.g.
            `"trl_es.tasks.arithmetic.extract_answer"`. A completion is then correct when its answer equals the eval
            set's `answer` column, and the answers decide Maj@k. Without it, a completion is correct when its weighted
            reward is above `success_reward_threshold`, and Maj@k is not logged.
        success_reward_threshold (`float`, *optional*, defaults to `0.0`):
            A completion whose weighted reward is above this counts as a success: in `es/js_diversity` and, without
            `eval_answer_extractor`, in the coverage evaluation.

        > Fields whose defaults differ from [`~trl.GRPOConfig`]

        learning_rate (`float`, *optional*, defaults to `5e-4`):
            ES step size alpha (= sigma / 2 in the anchor paper). The scheduler in `lr_scheduler_type` applies to it.
        lr_scheduler_type (`str`, *optional*, defaults to `"constant"`):
            The anchor paper keeps alpha constant.
        num_generations (`int`, *optional*, defaults to `1`):
            Completions per prompt for each member. More than one only makes sense with `temperature > 0`.
        temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature; `0.0` decodes greedily (the anchor paper's choice). With sampling, all members of a
            step share the same sampling seeds (common random numbers), so fitness differences come from the
            parameters rather than from sampling luck.
        disable_dropout (`bool`, *optional*, defaults to `True`):
            Dropout would add noise unrelated to the perturbation to every member's fitness.
        activation_checkpointing (`bool`, *optional*, defaults to `False`):
            ES has no backward pass, so there is nothing to checkpoint (TRL turns it on for GRPO).
        bf16 (`bool`, *optional*, defaults to `False`):
            Mixed precision has no effect on ES (no backward pass). Members generate in the model's dtype: pass
            `model_init_kwargs={"dtype": "bfloat16"}` for bf16 generation; the float32 master keeps the update exact.
    """

    population_size: int = field(
        default=30,
        metadata={"help": "Number of perturbed members evaluated per ES step (N)."},
    )
    sigma: float = field(
        default=1e-3,
        metadata={"help": "Standard deviation of the Gaussian parameter noise."},
    )
    sigma_schedule: str = field(
        default="constant",
        metadata={
            "help": "How sigma moves from `sigma` (first step) to `sigma_final` (last step).",
            "choices": list(SIGMA_SCHEDULES),
        },
    )
    sigma_final: float | None = field(
        default=None,
        metadata={"help": "Sigma at the last step of a linear or cosine sigma_schedule."},
    )
    sigma_target_js_diversity: float | None = field(
        default=None,
        metadata={"help": "Adapt sigma after each step to hold es/js_diversity (bits, in (0, 1]) near this target."},
    )
    sigma_adaptation_rate: float = field(
        default=0.1,
        metadata={"help": "Largest change of log(sigma) per step with sigma_target_js_diversity."},
    )
    antithetic: bool = field(
        default=False,
        metadata={"help": "Use mirrored noise pairs (+eps, -eps), the two-point estimator. Needs an even population."},
    )
    fitness_shaping: str = field(
        default="zscore",
        metadata={
            "help": "How member fitness is normalised before the update.",
            "choices": list(FITNESS_SHAPINGS),
        },
    )
    normalize_fitness_per_prompt: bool = field(
        default=False,
        metadata={"help": "Standardise each prompt's rewards across the population before averaging them."},
    )
    fitness_pass_at_k: int | None = field(
        default=None,
        metadata={"help": "Score members by their mean unbiased Pass@k over prompts instead of their mean reward."},
    )
    es_optimizer: str = field(
        default="sgd",
        metadata={
            "help": "What the update adds: the ES direction, its momentum, or Adam's step.",
            "choices": list(ES_OPTIMIZERS),
        },
    )
    es_momentum: float = field(
        default=0.9,
        metadata={"help": "Decay of the running direction with es_optimizer='momentum'."},
    )
    perturbation: str = field(
        default="full",
        metadata={"help": "Member noise: full-rank, or low-rank (EGGROLL) matrices.", "choices": list(PERTURBATIONS)},
    )
    lowrank_rank: int = field(
        default=1,
        metadata={"help": "Rank of each member's perturbation of each matrix with perturbation='lowrank'."},
    )
    lowrank_other_parameters: str = field(
        default="full",
        metadata={
            "help": "With perturbation='lowrank': full-rank noise for norms and biases, or keep them frozen.",
            "choices": list(OTHER_PARAMETERS),
        },
    )
    population_batch_size: int | None = field(
        default=None,
        metadata={"help": "Low-rank members generating together in one call; default: all of a process's members."},
    )
    kl_anchor_beta: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the KL anchor: fitness = mean reward - kl_anchor_beta x KL(start || member) per token "
            "on a fixed probe. 0 turns it off."
        },
    )
    kl_anchor_probe_size: int = field(
        default=32,
        metadata={"help": "Prompts in the KL anchor's probe (the first of the training set, or kl_probe_prompts)."},
    )

    shard_update: bool = field(
        default=True,
        metadata={
            "help": "With several processes, each computes the update of a share of the tensors and broadcasts it "
            "(bitwise the same result); in server mode they also split the master. Turn off where the network is "
            "slower than drawing the noise again."
        },
    )

    master_dtype: str = field(
        default="float32",
        metadata={
            "help": "Storage of the ES master: float32, or compensated_bfloat16 (a bfloat16 value and a bfloat16 "
            "residual, half the bytes, no update lost).",
            "choices": ["float32", "compensated_bfloat16"],
        },
    )

    offload_master: bool = field(
        default=False,
        metadata={
            "help": "Keep the float32 master and es_optimizer state in host memory (computed on the accelerator one "
            "tensor at a time: the same results, at a host-to-accelerator copy of the master per member)."
        },
    )
    offload_model: bool = field(
        default=True,
        metadata={
            "help": "With vLLM generating, keep the trainer's model in host memory, never on the accelerator whole "
            "(it follows the centre after every update); the accelerator holds the engine and the master."
        },
    )

    noise_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the members' noise and shared sampling seeds; `seed` when unset."},
    )

    consistency_check_steps: int = field(
        default=1,
        metadata={
            "help": "Every this many steps (and at the last one), check that every copy of the weights (vLLM "
            "engine or server) agrees with the master, and fail loudly if not. 0 disables the check."
        },
    )
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': base URL of the trl-es vllm-serve server (e.g. 'http://localhost:8000'), "
            "or several separated by commas, shared out between the training processes. If provided, "
            "vllm_server_host and vllm_server_port are ignored."
        },
    )
    vllm_server_secret_file: str | None = field(
        default=None,
        metadata={
            "help": "vllm_mode='server': file with the trl-es vllm-serve control secret (default: "
            "$TRL_ES_SERVER_SECRET, else ~/.cache/trl-es/vllm-server-<port>.secret)."
        },
    )
    hub_push_logs: bool = field(
        default=False,
        metadata={
            "help": "Also push the TensorBoard logs (runs/ in output_dir) to the Hub with the model; off, they stay "
            "on this machine (their names carry its host name)."
        },
    )

    eval_ks: list[int] | None = field(
        default=None,
        metadata={"help": "The k of Pass@k and Maj@k logged at every evaluation (e.g. 1 4 16); unset: not measured."},
    )
    eval_temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature of the Pass@k / Maj@k completions."},
    )
    eval_answer_extractor: str | None = field(
        default=None,
        metadata={
            "help": "Import path of a function from completion text to answer, compared with the eval set's `answer` "
            "column. Without it, correctness is a weighted reward above `success_reward_threshold`."
        },
    )
    success_reward_threshold: float = field(
        default=0.0,
        metadata={"help": "A completion whose weighted reward is above this counts as a success."},
    )

    # Defaults that differ from GRPOConfig
    learning_rate: float = field(
        default=5e-4,
        metadata={"help": "ES step size alpha (the 1/sigma of the gradient estimate is folded in)."},
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={"help": "Schedule of the ES step size; the anchor paper keeps it constant."},
    )
    num_generations: int | None = field(
        default=1,
        metadata={"help": "Completions per prompt for each member; more than one needs temperature > 0."},
    )
    temperature: float = field(
        default=0.0,
        metadata={"help": "Sampling temperature; 0.0 decodes greedily (the anchor paper's choice)."},
    )
    disable_dropout: bool = field(
        default=True,
        metadata={"help": "Disable dropout, which would add noise unrelated to the perturbation to every fitness."},
    )
    activation_checkpointing: bool | None = field(
        default=False,
        metadata={"help": "ES has no backward pass, so activation checkpointing only slows generation down."},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers v5)."},
    )
    bf16: bool | None = field(
        default=False,
        metadata={
            "help": "Mixed precision has no effect on ES, which runs no backward pass; choose the precision members "
            "generate in with `model_init_kwargs={'dtype': 'bfloat16'}`."
        },
    )

    def __post_init__(self):
        check_before_grpo(self)
        with one_completion_per_prompt_accepted(self):
            super().__post_init__()
        check_after_grpo(self)

    # What the trainer and the backends read, decided here once.

    @property
    def member_noise_seed(self) -> int:
        """The seed of the members' noise and of their shared sampling seeds: `noise_seed`, else `seed`."""
        return self.seed if self.noise_seed is None else self.noise_seed

    @property
    def prompts_per_step(self) -> int:
        """Prompts every member answers in one ES step (all processes together)."""
        return self.generation_batch_size // self.num_generations

    @property
    def members_per_generate_call(self) -> int:
        """Low-rank members generating together in one call: `population_batch_size`, else all of a process's."""
        return self.population_batch_size or self.population_size // max(self.world_size, 1)

    @property
    def model_in_host_memory(self) -> bool:
        """Whether the trainer's model stays in host memory (`offload_model` while vLLM generates)."""
        return self.use_vllm and self.offload_model

    @property
    def place_model_on_device(self) -> bool | None:
        """`Trainer`'s hook (a `TrainingArguments` property): `False` for a model kept in host memory, which is then
        loaded there and never put on the accelerator whole; `None` (the Trainer decides) otherwise."""
        return False if self.model_in_host_memory else None

    @property
    def vllm_server_urls(self) -> list[str]:
        """The `trl-es vllm-serve` servers of `vllm_mode="server"`: those `vllm_server_base_url` lists, else host and
        port."""
        return server_urls(self.vllm_server_base_url, self.vllm_server_host, self.vllm_server_port)

    def answer_extractor(self):
        """The function `eval_answer_extractor` names (completion text -> answer), or None."""
        return import_function(self.eval_answer_extractor, "eval_answer_extractor")

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig) -> ESConfig:
        """Convert a [`~trl.GRPOConfig`] so that an unmodified GRPO script runs with [`ESTrainer`].

        Every field set to a non-default value is carried over, except GRPO's loss settings (meaningless for ES) and
        `learning_rate`, which is an AdamW step size in GRPO (typically 1e-6) and would freeze ES; the ES defaults
        apply to those. A GRPO group (`num_generations > 1`) keeps GRPO's sampling temperature, since greedy decoding
        would make its completions identical.
        """
        return cls(**es_overrides_of(grpo_config))
