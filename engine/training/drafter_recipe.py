"""The drafter-training recipe and its presets: the drafter's shape, the data (the target's own continuations
of corpus prompts), the optimisation and the schedule. One frozen dataclass; training.json and every
checkpoint store it, and --resume continues from the stored one."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.config import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, ModelConfig
from engine.loaders.dflash_config import ARCHITECTURE as DFLASH_ARCHITECTURE
from engine.loaders.dflash_config import DFlashConfig, build_target_layer_ids
from engine.training.export import SAVE_DTYPE_CHOICES
from engine.training.recipe import TrainError

DRAFTER_SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "intermediate_size")


@dataclass(frozen=True, slots=True)
class DrafterRecipe:
    preset: str
    drafter: dict  # DRAFTER_SHAPE_FIELDS: the draft stack (hidden size and vocabulary are the target's)
    block_size: int  # [anchor, MASK x (block_size - 1)]; DFlash trains at the block size it drafts at
    target_layer_ids: tuple[int, ...] | None  # None: z-lab's spread, or every layer where that repeats layers
    num_sequences: int  # training sequences: corpus prompts + the target's greedy continuations
    prompt_len: int
    new_tokens: int  # the continuation's length; anchors lie in it
    eval_sequences: int  # held-out prompts + continuations, for the validation loss and acceptance
    steps: int
    batch_size: int  # sequences per step
    anchors: int  # blocks per sequence (SpecForge: 512 per long sequence)
    lr: float
    gamma: float  # loss weight exp(-(k - 1) / gamma) of block row k (DFlash: 4 at block 8, 7 at block 16)
    min_lr_share: float = 0.1
    warmup_share: float = 0.05
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    log_every: int = 25
    eval_every: int = 100
    checkpoint_every: int = 100
    save_dtype: str = "bfloat16"
    corpus_dir: str | None = None  # None: the Python standard library (engine/training/corpus.py)
    # The share of the training sequences whose continuation the target samples at sampled_temperature instead of
    # its greedy one: more varied contexts than greedy text, which repeats itself, and what T > 0 decoding meets.
    sampled_share: float = 0.0
    sampled_temperature: float = 0.8

    def __post_init__(self) -> None:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise TrainError(what)

        for name in ("num_sequences", "prompt_len", "eval_sequences", "steps", "batch_size", "anchors", "log_every",
                     "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name}={value!r}: expected an integer >= 1")
        need(isinstance(self.block_size, int) and MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE,
             f"block_size={self.block_size!r}: expected an integer in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]")
        need(isinstance(self.new_tokens, int) and self.new_tokens >= self.block_size + self.anchors - 1,
             f"new_tokens={self.new_tokens!r}: the continuation must hold anchors + block_size - 1 = "
             f"{self.anchors + self.block_size - 1} positions")
        need(self.lr > 0 and self.gamma > 0, "lr and gamma must be > 0")
        for name in ("min_lr_share", "warmup_share"):
            need(0 <= getattr(self, name) < 1, f"{name}={getattr(self, name)!r}: expected a number in [0, 1)")
        need(self.device in ("cpu", "cuda"), f"device={self.device!r}: expected cpu or cuda")
        need(self.save_dtype in SAVE_DTYPE_CHOICES,
             f"save_dtype={self.save_dtype!r}: expected one of {SAVE_DTYPE_CHOICES}")
        for name in ("eval_every", "checkpoint_every"):
            need(getattr(self, name) % self.log_every == 0,
                 f"{name}={getattr(self, name)} must be a multiple of log_every={self.log_every}")
        need(isinstance(self.sampled_share, (int, float)) and 0 <= self.sampled_share <= 1,
             f"sampled_share={self.sampled_share!r}: expected a share in [0, 1]")
        need(isinstance(self.sampled_temperature, (int, float)) and self.sampled_temperature > 0,
             f"sampled_temperature={self.sampled_temperature!r}: expected a temperature > 0")
        need(set(self.drafter) == set(DRAFTER_SHAPE_FIELDS), f"drafter shape fields {sorted(self.drafter)}: "
             f"expected {sorted(DRAFTER_SHAPE_FIELDS)}")

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.steps * self.warmup_share))

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @property
    def tokens_per_step(self) -> int:
        """Block rows trained per step."""
        return self.batch_size * self.anchors * (self.block_size - 1)

    def drafter_config(self, target: ModelConfig, mask_token_id: int) -> DFlashConfig:
        """The DFlash config of a drafter for this target (its hidden size and vocabulary; RoPE without scaling)."""
        ids = self.target_layer_ids
        if ids is None:
            spread = build_target_layer_ids(target.num_hidden_layers, self.drafter["num_hidden_layers"])
            ids = spread if len(set(spread)) == len(spread) else list(range(1, target.num_hidden_layers))
        need_positions = self.seq_len + self.block_size
        return DFlashConfig(hidden_size=target.hidden_size, vocab_size=target.vocab_size, block_size=self.block_size,
                            num_target_layers=target.num_hidden_layers, mask_token_id=mask_token_id,
                            target_layer_ids=tuple(ids), rms_norm_eps=target.rms_norm_eps,
                            max_position_embeddings=max(target.max_position_embeddings, need_positions),
                            **self.drafter)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterRecipe:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise TrainError(f"not a drafter recipe of this version ({DFLASH_ARCHITECTURE}); start a new run")
        ids = data["target_layer_ids"]
        return cls(**{**data, "betas": tuple(data["betas"]), "target_layer_ids": None if ids is None else tuple(ids)})


DRAFTER_PRESETS = {
    # Trains on a 2-core CPU in well under a minute against the tiny target preset (the tests' recipe).
    "tiny": DrafterRecipe(preset="tiny", drafter=dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                      head_dim=16, intermediate_size=128),
                          block_size=8, target_layer_ids=None, num_sequences=96, prompt_len=24, new_tokens=48,
                          eval_sequences=16, steps=120, batch_size=16, anchors=8, lr=3e-3, gamma=4.0,
                          log_every=20, eval_every=60, checkpoint_every=60),
    # About 4 M parameters (8 MB in bf16) against the showcase target: three layers reading target layers 1, 3 and 5
    # (the last: a shallow target's last layer holds most of its next-token guess), block 16, half the training
    # continuations sampled (docs/training.md).
    "showcase": DrafterRecipe(preset="showcase", drafter=dict(num_hidden_layers=3, num_attention_heads=8,
                                                              num_key_value_heads=4, head_dim=32,
                                                              intermediate_size=768),
                              block_size=16, target_layer_ids=(1, 3, 5), num_sequences=24576, prompt_len=64,
                              new_tokens=192, eval_sequences=256, steps=4800, batch_size=64, anchors=32, lr=3e-3,
                              gamma=7.0, log_every=50, eval_every=400, checkpoint_every=400, sampled_share=0.5),
    # Against the showcase-22m target: the same drafter reading its layers 1, 4 and 7 (the last again), saved in
    # fp8 (4.0 MB; on the pair before it an fp8 copy of its drafter kept tau within 1.4%, docs/training.md).
    "showcase-22m": DrafterRecipe(preset="showcase-22m", drafter=dict(num_hidden_layers=3, num_attention_heads=8,
                                                                      num_key_value_heads=4, head_dim=32,
                                                                      intermediate_size=768),
                                  block_size=16, target_layer_ids=(1, 4, 7), num_sequences=24576, prompt_len=64,
                                  new_tokens=192, eval_sequences=256, steps=4800, batch_size=64, anchors=32, lr=3e-3,
                                  gamma=7.0, log_every=50, eval_every=400, checkpoint_every=400, sampled_share=0.5,
                                  save_dtype="fp8"),
}
