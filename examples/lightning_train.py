#!/usr/bin/env python3
"""A PyTorch Lightning run with LuminaMoon: ``configure_optimizers``, checkpoints, resume.

A small byte-level transformer (examples/tiny_gpt.py) learns the Python standard library's own
sources. ``configure_optimizers`` returns LuminaMoon and a per-step LambdaLR schedule;
``ModelCheckpoint`` saves every epoch (and ``last.ckpt``); ``--resume-from CKPT`` continues with
``Trainer.fit(..., ckpt_path=CKPT)``. On resume the script compares the optimizer's state, as
Lightning restored it before the first step, with the checkpoint's ``optimizer_states[0]``.

    python examples/lightning_train.py                     # 3 epochs, a checkpoint each
    python examples/lightning_train.py --resume-from out/lightning/checkpoints/epoch=1-step=210.ckpt \
        --out out/lightning_resumed

``--precision bf16-true`` trains bf16 weights, which LuminaMoon rounds stochastically from its
seed (restored from the checkpoint on resume). The data order is a seeded shuffle per epoch
(a sampler with ``set_epoch``), so a resumed run sees the batches the uninterrupted one saw.
Runs on the CPU by default and on a GPU when present (``--accelerator``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from optim_state import clone_state, compare_states  # noqa: E402
from stdlib_text import VOCAB_SIZE, split_blocks, token_blocks  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="out/lightning", help="root folder (checkpoints/ inside)")
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--resume-from", default=None, help="a .ckpt of an earlier run to continue")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--text-bytes", type=int, default=120_000,
                   help="bytes of standard-library source (the last tenth is held out)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=4.0, help="LuminaMoon's soft clip")
    p.add_argument("--precision", default="32-true",
                   choices=("32-true", "bf16-true", "bf16-mixed"))
    p.add_argument("--seed", type=int, default=0, help="model init, data order, dropout")
    p.add_argument("--opt-seed", type=int, default=None,
                   help="LuminaMoon's rounding seed (default: drawn; a resumed run takes the "
                        "checkpoint's)")
    p.add_argument("--accelerator", default="auto", help="Lightning's accelerator: auto, cpu, gpu")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-step log lines (the summary still prints)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    from luminamoon import LuminaMoon
    from tiny_gpt import TinyGPT

    class EpochShuffle(Sampler):
        """A shuffle seeded by (seed, epoch): Lightning calls set_epoch before each epoch."""

        def __init__(self, n: int, seed: int):
            self.n, self.seed, self.epoch = n, seed, 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            return iter(torch.randperm(self.n, generator=gen).tolist())

        def __len__(self) -> int:
            return self.n

    train_blocks, val_blocks = token_blocks(args.text_bytes, args.block_size)
    train_set = TensorDataset(*split_blocks(train_blocks))
    val_set = TensorDataset(*split_blocks(val_blocks))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, drop_last=True,
                              sampler=EpochShuffle(len(train_set), args.seed))
    val_loader = DataLoader(val_set, batch_size=args.batch_size)
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * args.max_epochs

    class LitLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = TinyGPT(VOCAB_SIZE, args.block_size, args.d_model, args.n_layer,
                                 args.n_head, args.dropout)
            self.losses: List[tuple] = []  # (global step of the update, training loss)
            self.val_losses: List[tuple] = []  # (epoch, mean validation loss)
            self.restored: Dict[str, Any] = {}
            self._val = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = self.model.loss(x, y)
            self.losses.append((self.global_step + 1, float(loss.detach())))
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            loss = self.model.loss(*batch)
            self._val.append(float(loss))
            self.log("val_loss", loss, prog_bar=True)

        def on_validation_epoch_end(self):
            if self._val and not self.trainer.sanity_checking:
                self.val_losses.append((self.current_epoch, sum(self._val) / len(self._val)))
            self._val = []

        def on_train_start(self):
            # after Lightning restored the checkpoint (if any), before the first step
            opt = self.optimizers().optimizer
            self.restored = dict(global_step=self.global_step, epoch=self.current_epoch,
                                 state_dict=clone_state(opt.state_dict()), seed=opt.seed)

        def configure_optimizers(self):
            decay = [p for p in self.parameters() if p.dim() >= 2]
            no_decay = [p for p in self.parameters() if p.dim() < 2]
            opt = LuminaMoon([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), clip=args.clip, seed=args.opt_seed)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, _warmup_cosine(args.warmup_steps, total_steps))
            return {"optimizer": opt,
                    "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    L.seed_everything(args.seed, verbose=not args.quiet)
    module = LitLM()
    ckpt_dir = os.path.join(args.out, "checkpoints")
    checkpoint = ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}-{step}", every_n_epochs=1,
                                 save_top_k=-1, save_last=True)
    trainer = L.Trainer(max_epochs=args.max_epochs, accelerator=args.accelerator, devices=1,
                        precision=args.precision, callbacks=[checkpoint], logger=False,
                        enable_progress_bar=not args.quiet, enable_model_summary=not args.quiet,
                        num_sanity_val_steps=0, log_every_n_steps=1,
                        default_root_dir=args.out)
    t0 = time.perf_counter()
    trainer.fit(module, train_loader, val_loader, ckpt_path=args.resume_from)
    seconds = time.perf_counter() - t0
    opt = trainer.optimizers[0]

    result: Dict[str, Any] = dict(
        losses=module.losses, val_losses=module.val_losses, global_step=trainer.global_step,
        epoch=trainer.current_epoch, steps_per_epoch=steps_per_epoch, seconds=seconds,
        restored=module.restored, opt_seed=opt.seed, checkpoint_dir=ckpt_dir,
        device=str(module.device), param_dtype=str(next(module.parameters()).dtype))
    if args.resume_from:
        saved = torch.load(args.resume_from, map_location="cpu", weights_only=False)
        result["saved_optimizer_state"] = saved["optimizer_states"][0]
        result["saved_global_step"] = saved["global_step"]
        result["saved_epoch"] = saved["epoch"]
        result["resume_problems"] = compare_states(module.restored["state_dict"],
                                                   saved["optimizer_states"][0])
    losses = module.losses
    first = sum(l for _, l in losses[:10]) / max(1, len(losses[:10]))
    last = sum(l for _, l in losses[-10:]) / max(1, len(losses[-10:]))
    print(f"device {result['device']} ({result['param_dtype']}); steps "
          f"{losses[0][0] if losses else '-'}..{trainer.global_step} in {seconds:.1f} s; "
          f"train loss (mean of 10) {first:.4f} -> {last:.4f}")
    print("val loss by epoch: " + ", ".join(f"{e}: {v:.4f}" for e, v in module.val_losses)
          + f" (uniform bytes: {math.log(VOCAB_SIZE):.4f})")
    if args.resume_from:
        problems = result["resume_problems"]
        print(f"resumed at epoch {module.restored['epoch']}, global step "
              f"{module.restored['global_step']}; optimizer state as restored vs the "
              f"checkpoint's: " + ("identical (moments, steps, seed)" if not problems
                                   else "DIFFERS: " + "; ".join(problems[:5])))
    print(f"LuminaMoon seed {opt.seed}; checkpoints under {ckpt_dir}")
    return result


def _warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t))

    return factor


if __name__ == "__main__":
    main()
