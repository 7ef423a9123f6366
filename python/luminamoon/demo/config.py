"""demo/config.py: the demo's configuration: every run of a comparison depends on Config only."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    """Everything a demo run depends on; the defaults are the full `make demo`."""

    steps: int = 400
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    ctx: int = 64
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 30
    min_lr_ratio: float = 0.02  # cosine decay to this fraction of lr
    betas: Tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.01
    clip: float = 4.0
    eval_every: int = 25
    eval_batches: int = 8
    train_bytes: int = 1_200_000
    val_bytes: int = 150_000
    spike_at: float = 0.3  # first spike step, as a fraction of the run
    spike_steps: int = 3
    spike_scale: float = 1e3
    spike_layer: str = "blocks.0.fc.weight"
    poison_at: float = 0.45  # first poisoned batch, as a fraction of the run
    poison_steps: int = 3
    poison_scale: float = 1e3
    nan_at: float = 0.7  # the NaN step, as a fraction of the run
    nan_param: str = "blocks.1.out.weight"
    bench_steps: int = 40
    bench_warmup: int = 5
    bench_reference: bool = True  # time the reference backend too (slow: an oracle)
    control_run: bool = True  # LuminaMoon bf16 rounding to nearest

    @property
    def timing_warmup(self) -> int:
        """Steps of a training run left out of its tokens/s and optimizer time (the first pay
        for kernel compilation and cold caches)."""
        return min(10, self.steps // 4)

    @property
    def spike_range(self) -> range:
        first = int(self.spike_at * self.steps)
        return range(first, first + self.spike_steps)

    @property
    def poison_range(self) -> range:
        first = int(self.poison_at * self.steps)
        return range(first, first + self.poison_steps)

    @property
    def nan_step(self) -> int:
        return int(self.nan_at * self.steps)

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.min_lr_ratio
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


QUICK = dict(steps=120, eval_every=20, eval_batches=4, bench_steps=15, bench_warmup=3,
             train_bytes=300_000, val_bytes=60_000, control_run=False, bench_reference=False)
