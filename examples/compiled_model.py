#!/usr/bin/env python3
"""LuminaMoon with ``torch.compile``: a compiled model, and a compiled training step.

A small byte-level transformer (examples/tiny_gpt.py) learns the Python standard library's own
sources, from the same initial weights and the same batches, three ways:

* ``eager``: no compilation;
* ``module``: ``torch.compile(model)``, with LuminaMoon stepping outside the compiled code;
* ``step``: a whole training step (zero_grad, forward, backward, ``opt.step()``) compiled with
  ``torch.compile``: Dynamo breaks the graph around the backward pass and around LuminaMoon's
  step, whose kernels it does not trace;
* ``resume``: the compiled step again, stopped halfway: the model's and the optimizer's state
  dicts go through ``torch.save`` and ``torch.load`` into a new model, optimizer and compiled
  step, which train on.

It prints each run's losses and the largest difference from the eager run (a run that fails
is reported and the others still go; the exit status is then 1). With ``--backend aot_eager``
the compiled model runs the same ATen operations as eager, so losses and weights should be
bitwise equal; ``inductor`` (the default) generates fused kernels whose float arithmetic is
ordered differently, so its losses agree to rounding, not necessarily bitwise.

It also compiles a function that only calls ``opt.step()`` with ``fullgraph=True``: LuminaMoon's
step launches kernels Dynamo does not trace, so this must fail with Dynamo's ``Unsupported``
error naming LuminaMoon; the script prints the error's first line.

    python examples/compiled_model.py                       # inductor, 30 steps
    python examples/compiled_model.py --backend aot_eager --steps 10
    python examples/compiled_model.py --optimizer adamw     # the same with torch's AdamW
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stdlib_text import VOCAB_SIZE, split_blocks, token_blocks  # noqa: E402

MODES = ("eager", "module", "step", "resume")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated runs out of {', '.join(MODES)}")
    p.add_argument("--backend", default="inductor",
                   help="torch.compile backend: inductor, aot_eager, eager")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--text-bytes", type=int, default=200_000)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=4.0, help="LuminaMoon's soft clip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opt-seed", type=int, default=1234, help="LuminaMoon's rounding seed")
    p.add_argument("--no-fullgraph-check", action="store_true",
                   help="skip the fullgraph=True compile of opt.step()")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--optimizer", choices=("luminamoon", "adamw"), default="luminamoon",
                   help="adamw: torch.optim.AdamW with the same lr and betas, to see how far "
                        "the compiler alone moves a run from eager")
    return p.parse_args(argv)


def _batches(args, device):
    import torch

    train_blocks, _ = token_blocks(args.text_bytes, args.block_size)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randint(0, len(train_blocks), (args.steps, args.batch_size), generator=gen)
    x, y = split_blocks(train_blocks)
    return [(x[i].to(device), y[i].to(device)) for i in order]


def _setup(mode: str, args, device):
    """The model (the same initial weights for every mode), its optimizer and a training step."""
    import torch

    from luminamoon import LuminaMoon
    from tiny_gpt import TinyGPT

    torch.manual_seed(args.seed)
    model = TinyGPT(VOCAB_SIZE, args.block_size, args.d_model, args.n_layer, args.n_head,
                    dropout=0.0).to(device)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=0.01)
    else:
        opt = LuminaMoon(model.parameters(), lr=args.lr, betas=(0.9, 0.95), clip=args.clip,
                         seed=args.opt_seed)
    torch._dynamo.reset()

    if mode == "eager":
        def train_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = model.loss(x, y)
            loss.backward()
            opt.step()
            return loss
    elif mode == "module":
        compiled = torch.compile(model, backend=args.backend)

        def train_step(x, y):
            opt.zero_grad(set_to_none=True)
            logits = compiled(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            return loss
    elif mode in ("step", "resume"):
        @torch.compile(backend=args.backend)
        def train_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = model.loss(x, y)
            loss.backward()
            opt.step()
            return loss
    else:
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    return model, opt, train_step


def run(mode: str, args, batches, device) -> Dict[str, Any]:
    """One training run of ``len(batches)`` steps; the same initial weights for every mode.

    ``resume``: the compiled training step stops halfway, saves the model's and the
    optimizer's state dicts (torch.save), and a new model, optimizer and compiled step load
    them and take the other half."""
    import tempfile

    import torch

    model, opt, train_step = _setup(mode, args, device)
    losses = []
    t0 = time.perf_counter()
    stop = len(batches) // 2 if mode == "resume" else len(batches)
    for x, y in batches[:stop]:
        losses.append(float(train_step(x, y).detach()))
    if mode == "resume":
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "checkpoint.pt")
            torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict()), path)
            model, opt, train_step = _setup(mode, args, device)  # a fresh process would
            ckpt = torch.load(path, map_location=device, weights_only=True)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        for x, y in batches[stop:]:
            losses.append(float(train_step(x, y).detach()))
    seconds = time.perf_counter() - t0
    params = [p.detach().clone() for p in model.parameters()]
    return dict(losses=losses, seconds=seconds, params=params,
                state=opt.state_dict(), skipped=int(getattr(opt, "skipped_steps", 0)))


def fullgraph_step_error(args, device) -> Optional[BaseException]:
    """Compiles ``lambda: opt.step()`` with fullgraph=True after an eager backward; returns the
    exception it raised (None if it compiled)."""
    import torch

    from luminamoon import LuminaMoon

    torch.manual_seed(args.seed)
    model = torch.nn.Linear(8, 8).to(device)
    opt = LuminaMoon(model.parameters(), lr=args.lr, seed=args.opt_seed)
    model(torch.randn(4, 8, device=device)).square().mean().backward()
    torch._dynamo.reset()

    def step():
        opt.step()

    try:
        torch.compile(step, fullgraph=True, backend=args.backend)()
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return exc
    return None


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    batches = _batches(args, device)
    runs = {}
    for mode in modes:
        how = "no compile" if mode == "eager" else args.backend
        try:
            runs[mode] = r = run(mode, args, batches, device)
        except Exception as exc:  # noqa: BLE001 - reported; the other runs still go
            runs[mode] = dict(error=exc)
            print(f"{mode:>6} ({how}): FAILED: {type(exc).__name__}: "
                  f"{(str(exc).strip().splitlines() or [''])[0]}")
            continue
        print(f"{mode:>6} ({how}): loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} "
              f"in {r['seconds']:.1f} s")
    result: Dict[str, Any] = dict(runs=runs, device=device, backend=args.backend)
    failed = [m for m, r in runs.items() if "error" in r]
    result["failed"] = failed
    if "eager" in runs and "eager" not in failed:
        ref = runs["eager"]
        for mode, r in runs.items():
            if mode == "eager" or mode in failed:
                continue
            diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
            same = r["losses"] == ref["losses"]
            same_params = all(torch.equal(a, b) for a, b in zip(r["params"], ref["params"]))
            r.update(max_loss_diff=diff, bitwise_losses=same, bitwise_params=same_params)
            print(f"{mode:>6} vs eager: losses {'bitwise equal' if same else 'differ'} "
                  f"(max |diff| {diff:.3g}), final weights "
                  f"{'bitwise equal' if same_params else 'differ'}")
    if not args.no_fullgraph_check:
        err = fullgraph_step_error(args, device)
        result["fullgraph_error"] = err
        if err is None:
            print("fullgraph=True compile of opt.step(): compiled (no error)")
        else:
            first = (str(err).strip().splitlines() or [""])[0]
            print(f"fullgraph=True compile of opt.step(): {type(err).__name__}: {first}")
    print(f"device {device}; uniform bytes would give {math.log(VOCAB_SIZE):.4f}")
    return result


if __name__ == "__main__":
    failed = main()["failed"]
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
