#!/usr/bin/env python3
"""A Hugging Face Transformers ``Trainer`` run with LuminaMoon.

A small GPT-2 built from ``GPT2Config`` (no download: random initial weights, a byte-level
vocabulary of 256) learns the Python standard library's own sources. The optimizer and the
scheduler are handed to the Trainer as ``optimizers=(LuminaMoon(...), LambdaLR(...))``; the
Trainer saves a checkpoint every ``--save-steps`` steps (model, optimizer.pt, scheduler.pt,
trainer state, RNG states), and ``--resume-from CHECKPOINT`` continues a run with
``trainer.train(resume_from_checkpoint=CHECKPOINT)``. On resume the script compares the
optimizer's state, as loaded by the Trainer before the first step, with the checkpoint's
``optimizer.pt`` and prints the result.

    python examples/hf_trainer.py                       # 120 steps, checkpoints every 40
    python examples/hf_trainer.py --resume-from out/hf_trainer/checkpoint-80 \
        --out out/hf_trainer_resumed

Runs on the CPU by default and on CUDA when a GPU is present (``--device``). Hub access is
switched off (HF_HUB_OFFLINE=1) before transformers is imported.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from optim_state import clone_state, compare_states  # noqa: E402
from stdlib_text import VOCAB_SIZE, token_blocks  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="out/hf_trainer", help="Trainer output_dir (checkpoints)")
    p.add_argument("--max-steps", type=int, default=120, help="total optimizer steps")
    p.add_argument("--save-steps", type=int, default=40, help="checkpoint every N steps")
    p.add_argument("--resume-from", default=None,
                   help="a checkpoint folder of an earlier run (…/checkpoint-N) to continue")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64, help="tokens per training sequence")
    p.add_argument("--text-bytes", type=int, default=600_000,
                   help="bytes of standard-library source to train and evaluate on")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the model's weights (bfloat16: LuminaMoon rounds its stores "
                        "stochastically, from its seed)")
    p.add_argument("--dropout", type=float, default=0.1, help="GPT-2's dropout probabilities")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1,
                   help="LuminaMoon's decoupled decay on weights (biases, LayerNorm: none)")
    p.add_argument("--clip", type=float, default=4.0, help="LuminaMoon's soft clip")
    p.add_argument("--named-params", action="store_true",
                   help="give LuminaMoon (name, parameter) pairs instead of bare parameters")
    p.add_argument("--seed", type=int, default=0, help="model init, data order, dropout")
    p.add_argument("--opt-seed", type=int, default=None,
                   help="LuminaMoon's rounding seed (default: drawn; a resumed run takes the "
                        "checkpoint's)")
    p.add_argument("--eval-batches", type=int, default=8,
                   help="held-out batches for the eval loss before and after training")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-step log lines (the summary still prints)")
    return p.parse_args(argv)


class BlockDataset:
    """Fixed-length byte blocks as GPT-2 inputs; the model shifts the labels itself."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        block = self.blocks[i]
        return {"input_ids": block, "labels": block}


def param_groups(model, weight_decay: float, named: bool) -> List[Dict[str, Any]]:
    """Decay on matrices, none on biases and LayerNorm gains (the usual GPT-2 split)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append((name, p) if named else p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(warmup: int, total: int):
    """LambdaLR's factor: linear warm-up, then a cosine to 10 % of the peak."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t))

    return factor


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    import torch
    import transformers
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments)

    from luminamoon import LuminaMoon

    if args.quiet:
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    transformers.set_seed(args.seed)

    train_blocks, eval_blocks = token_blocks(args.text_bytes, args.block_size)
    eval_blocks = eval_blocks[: args.eval_batches * args.batch_size]
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=args.block_size + 1,
                        n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                        resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                        attn_pdrop=args.dropout, bos_token_id=0, eos_token_id=0)
    # On the device before the optimizer is built: the optimizer keeps these tensors.
    model = GPT2LMHeadModel(config).to(device=device, dtype=getattr(torch, args.dtype))

    opt = LuminaMoon(param_groups(model, args.weight_decay, args.named_params), lr=args.lr,
                     betas=(0.9, 0.95), weight_decay=args.weight_decay, clip=args.clip,
                     seed=args.opt_seed)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.warmup_steps,
                                                                 args.max_steps))

    losses: List[tuple] = []  # (global step, training loss of that step)
    resume_check: Dict[str, Any] = {}

    class RecordingTrainer(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            losses.append((self.state.global_step + 1, float(loss)))
            return loss

    class ResumeCheck(TrainerCallback):
        """At train begin (after the Trainer loaded optimizer.pt and scheduler.pt), copy the
        live optimizer state to compare with the checkpoint's."""

        def on_train_begin(self, targs, state, control, **kwargs):
            resume_check["global_step"] = state.global_step
            resume_check["state_dict"] = clone_state(trainer.optimizer.state_dict())
            resume_check["seed"] = opt.seed

    targs = TrainingArguments(
        output_dir=args.out, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        save_strategy="steps", save_steps=args.save_steps, save_total_limit=None,
        logging_steps=args.logging_steps, report_to="none", seed=args.seed,
        dataloader_num_workers=0, use_cpu=(device == "cpu"), disable_tqdm=args.quiet,
        eval_strategy="no")
    trainer = RecordingTrainer(model=model, args=targs, train_dataset=BlockDataset(train_blocks),
                               eval_dataset=BlockDataset(eval_blocks), optimizers=(opt, sched),
                               callbacks=[ResumeCheck()])
    if args.quiet:
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)

    eval_before = None if args.resume_from else trainer.evaluate()["eval_loss"]
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=args.resume_from)
    seconds = time.perf_counter() - t0
    eval_after = trainer.evaluate()["eval_loss"]

    result: Dict[str, Any] = dict(
        losses=losses, eval_before=eval_before, eval_after=eval_after,
        global_step=trainer.state.global_step, seconds=seconds, device=device,
        opt_seed=opt.seed, out=args.out, resume=resume_check)
    if args.resume_from:
        saved = torch.load(os.path.join(args.resume_from, "optimizer.pt"), map_location="cpu",
                           weights_only=True)
        result["resume_problems"] = compare_states(resume_check["state_dict"], saved)
        result["saved_state_dict"] = saved
    first = sum(l for _, l in losses[:10]) / max(1, len(losses[:10]))
    last = sum(l for _, l in losses[-10:]) / max(1, len(losses[-10:]))
    print(f"device {device}; steps {losses[0][0] if losses else '-'}..{result['global_step']}"
          f" in {seconds:.1f} s; train loss (mean of 10) {first:.4f} -> {last:.4f}")
    if eval_before is not None:
        print(f"eval loss {eval_before:.4f} -> {eval_after:.4f} (uniform bytes: "
              f"{math.log(VOCAB_SIZE):.4f})")
    else:
        print(f"eval loss after the resumed run {eval_after:.4f}")
    if args.resume_from:
        problems = result["resume_problems"]
        print(f"resumed at global step {resume_check['global_step']}; optimizer state as "
              f"loaded vs {args.resume_from}/optimizer.pt: "
              + ("identical (moments, steps, seed)" if not problems
                 else "DIFFERS: " + "; ".join(problems[:5])))
    print(f"LuminaMoon seed {opt.seed}; checkpoints under {args.out}")
    return result


if __name__ == "__main__":
    main()
