"""The training recipe (model shape, optimisation, data, schedule of logs/evals/checkpoints) and its presets.

One frozen dataclass holds every knob a run used; training.json and every checkpoint store it, and --resume
continues from the stored one."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.config import ConfigError, ModelConfig
from engine.training.export import SAVE_DTYPE_CHOICES


class TrainError(ValueError):
    """A training run cannot start or go on as asked; the message says what to change."""


# The model shapes, without vocab_size (the tokenizer decides it).
TINY_MODEL = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=192, moe_intermediate_size=64,
    n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, rope_interleave=True,
    max_position_embeddings=256,
)
SHOWCASE_MODEL = dict(
    hidden_size=384, num_hidden_layers=6, num_attention_heads=12, q_lora_rank=192, kv_lora_rank=128,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, intermediate_size=576, moe_intermediate_size=192,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1, rope_interleave=True,
    max_position_embeddings=1024,
)
SHOWCASE_22M_MODEL = {**SHOWCASE_MODEL, "num_hidden_layers": 8}


@dataclass(frozen=True, slots=True)
class Recipe:
    preset: str
    model: dict  # ModelConfig fields but vocab_size
    vocab_size: int  # of the BPE tokenizer trained when none is given
    steps: int
    batch_size: int  # sequences per step
    seq_len: int  # tokens per sequence (each predicts its next token)
    lr: float  # peak learning rate (AdamW)
    min_lr_share: float = 0.1  # the cosine decays to lr * min_lr_share
    warmup_share: float = 0.05  # linear warm-up over this share of the steps
    weight_decay: float = 0.1  # on matrices and the embedding, not on norms
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global gradient norm
    dropout: float = 0.0  # on each residual branch, training only (the saved model has none)
    bias_update_speed: float = 1e-3  # aux-loss-free balancing step (DeepSeek-V3: 0.001)
    seed: int = 0
    device: str = "cpu"
    log_every: int = 25  # steps per logged interval (the only host syncs)
    eval_every: int = 100  # validation every this many steps (a multiple of log_every), and at the end
    eval_windows: int = 64  # held-out sequences of seq_len per validation
    checkpoint_every: int = 100  # a multiple of log_every
    save_dtype: str = "bfloat16"
    corpus_dir: str | None = None  # None: the Python standard library
    sample_prompts: int = 32  # greedy continuations of held-out prompts at the end (distinct-4-gram rate)
    sample_prompt_len: int = 32  # the prompts' tokens, also those of the unlikelihood term's prompts
    sample_new_tokens: int = 128  # the continuations' tokens, also those the unlikelihood term generates
    init_from: str | None = None  # a model directory train-target wrote whose weights start the run; None: fresh
    unlikelihood_weight: float = 0.0  # of the sequence-level unlikelihood term (engine/training/unlikelihood.py)
    unlikelihood_batch: int = 8  # prompts it continues greedily, cut from the step's windows (first pieces first)
    unlikelihood_every: int = 1  # the term joins every this many steps (a multiple of it starts each logged interval)
    compile: bool = False  # torch.compile the step's next-token loss (fused kernels; rounding differs slightly)

    def __post_init__(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise TrainError(what)

        for name in ("steps", "batch_size", "log_every", "eval_every", "eval_windows", "checkpoint_every",
                     "sample_prompts", "sample_prompt_len", "sample_new_tokens", "unlikelihood_batch",
                     "unlikelihood_every"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name}={value!r}: expected an integer >= 1")
        need(isinstance(self.seq_len, int) and self.seq_len >= 2, f"seq_len={self.seq_len!r}: expected >= 2")
        need(isinstance(self.seed, int) and self.seed >= 0, f"seed={self.seed!r}: expected an integer >= 0")
        need(self.lr > 0, f"lr={self.lr!r}: expected a learning rate > 0")
        for name in ("min_lr_share", "warmup_share", "dropout"):
            need(0 <= getattr(self, name) < 1, f"{name}={getattr(self, name)!r}: expected a number in [0, 1)")
        need(self.unlikelihood_weight >= 0, f"unlikelihood_weight={self.unlikelihood_weight!r}: expected >= 0")
        if self.unlikelihood_weight:
            pieces = self.batch_size * (self.seq_len // self.sample_prompt_len)
            need(self.unlikelihood_batch <= pieces,
                 f"unlikelihood_batch={self.unlikelihood_batch} exceeds the {pieces} prompts of sample_prompt_len="
                 f"{self.sample_prompt_len} tokens that a step's {self.batch_size} windows of seq_len={self.seq_len} "
                 "hold; lower --unlikelihood-batch")
            need(self.log_every % self.unlikelihood_every == 0,
                 f"unlikelihood_every={self.unlikelihood_every} must divide log_every={self.log_every}, so that a "
                 "resumed run adds the term at the same steps")
        need(self.weight_decay >= 0 and self.grad_clip > 0 and self.bias_update_speed >= 0,
             "weight_decay and bias_update_speed must be >= 0 and grad_clip > 0")
        need(self.device in ("cpu", "cuda"), f"device={self.device!r}: expected cpu or cuda")
        need(isinstance(self.compile, bool), f"compile={self.compile!r}: expected True or False")
        need(self.save_dtype in SAVE_DTYPE_CHOICES,
             f"save_dtype={self.save_dtype!r}: expected one of {SAVE_DTYPE_CHOICES}")
        for name in ("eval_every", "checkpoint_every"):
            need(getattr(self, name) % self.log_every == 0,
                 f"{name}={getattr(self, name)} must be a multiple of log_every={self.log_every} (logs, evals and "
                 "checkpoints land on interval boundaries)")
        max_positions = self.model.get("max_position_embeddings", 0)
        need(self.seq_len <= max_positions, f"seq_len={self.seq_len} is larger than the model's "
             f"max_position_embeddings={max_positions}; shorten --seq-len")
        need(self.sample_prompt_len + self.sample_new_tokens <= max_positions,
             f"sample_prompt_len + sample_new_tokens = {self.sample_prompt_len + self.sample_new_tokens} exceeds "
             f"max_position_embeddings={max_positions}")
        try:
            self.model_config(self.vocab_size)
        except ConfigError as exc:
            raise TrainError(f"the recipe's model is invalid: {exc}") from exc

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.steps * self.warmup_share))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, **self.model)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Recipe:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise TrainError(f"not a recipe of this version: fields {sorted(data) if isinstance(data, dict) else data}"
                             f", expected {sorted(names)}; start a new run")
        return cls(**{**data, "betas": tuple(data["betas"])})


PRESETS = {
    # Trains on a 2-core CPU in well under a minute (the tests' recipe).
    "tiny": Recipe(preset="tiny", model=TINY_MODEL, vocab_size=512, steps=300, batch_size=12, seq_len=160,
                   lr=6e-3, log_every=25, eval_every=100, eval_windows=32, checkpoint_every=100),
    # About 16.7 M parameters (19.9 MB in fp8): the pair shipped before ddtree-py-22m (docs/training.md): 7000 steps,
    # about 6 epochs of the stdlib + torch + packages corpus, in two device calls (a checkpoint every 250 steps).
    "showcase": Recipe(preset="showcase", model=SHOWCASE_MODEL, vocab_size=4096, steps=7000, batch_size=32,
                       seq_len=1024, lr=2e-3, dropout=0.1, log_every=50, eval_every=250, eval_windows=128,
                       checkpoint_every=250, save_dtype="fp8"),
    # The shipped pair's target (models/ddtree-py-22m): two more layers (21.7 M parameters, 24.9 MB in fp8, which an
    # fp8 drafter leaves room for), 5.98 epochs of the corpus with --with-app-packages (benchmarks/stage_corpus.py:
    # 46.56 M training tokens), compiled steps (about 11 minutes on one H100).
    "showcase-22m": Recipe(preset="showcase-22m", model=SHOWCASE_22M_MODEL, vocab_size=4096, steps=8500,
                           batch_size=32, seq_len=1024, lr=2e-3, dropout=0.1, log_every=50, eval_every=250,
                           eval_windows=128, checkpoint_every=250, save_dtype="fp8", compile=True),
}
