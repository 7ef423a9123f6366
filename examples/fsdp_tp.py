#!/usr/bin/env python3
"""LuminaMoon under FSDP2 with tensor parallelism on a 2-D mesh, as torchtitan composes them.

A small byte-level transformer (examples/tiny_gpt.py's model) is split over a (dp, tp) mesh:
each block's MLP is tensor-parallel (its first projection ColwiseParallel: weight and bias
Shard(0) on "tp"; its second RowwiseParallel: weight Shard(1) on "tp", bias replicated), then
every block and the model are sharded with FSDP2's ``fully_shard`` on "dp" (the fused qkv
projection of this small model stays whole on the tp ranks). The optimizer sees
DTensor parameters with 2-D placements (Shard(0) on dp over Shard(0)/Shard(1) on tp) and
steps each with the statistics of the whole tensor. Every few steps the run saves a
torch.distributed.checkpoint; ``--resume`` continues from the last one.

    torchrun --nproc-per-node 4 examples/fsdp_tp.py --dp 2 --tp 2            # CPU, gloo
    torchrun --nproc-per-node 4 examples/fsdp_tp.py --dp 2 --tp 2 --device cuda   # NCCL
    torchrun --nproc-per-node 4 examples/fsdp_tp.py --dp 2 --tp 2 --resume --steps 20

Rank 0 prints the loss of every step and, at the end, one JSON line ("RESULT {...}") with
the losses, the optimizer's skipped steps and the placements it stepped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stdlib_text import VOCAB_SIZE, split_blocks, token_blocks  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dp", type=int, default=2, help="data-parallel (FSDP2) ranks")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8, help="per data-parallel rank")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--text-bytes", type=int, default=100_000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt", default="out/fsdp_tp/ckpt")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--resume", action="store_true", help="load --ckpt first")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 parameters with stochastic rounding (rounding bits keyed on each "
                        "element's global index, also for Shard(1) shards)")
    return p.parse_args(argv)


def _parallelize(model, mesh, args):
    import torch
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 7) and mesh.device_type == "cpu":
        raise SystemExit(f"FSDP2 of torch {torch.__version__} cannot take a step on CPU (CUDA "
                         f"streams in 2.4/2.5, a CPU stream without record_event in 2.6): on "
                         f"CPU this example needs torch >= 2.7 (or run it on GPUs)")
    tp, dp = mesh["tp"], mesh["dp"]
    for block in model.blocks:
        parallelize_module(block, tp, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    return model


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    from luminamoon import LuminaMoon
    from tiny_gpt import TinyGPT

    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != args.dp * args.tp:
        raise SystemExit(f"--dp {args.dp} x --tp {args.tp} = {args.dp * args.tp} ranks, but "
                         f"{world} were started: pass --nproc-per-node {args.dp * args.tp}")
    if (4 * args.d_model) % args.tp:
        raise SystemExit(f"the MLP width 4 x --d-model {args.d_model} must be a multiple of "
                         f"--tp {args.tp}")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" \
        else torch.device("cpu")
    mesh = init_device_mesh(args.device, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(0)  # the same initial weights on every rank before they are split
    model = TinyGPT(VOCAB_SIZE, args.block_size, args.d_model, args.n_layer, args.n_head,
                    dropout=0.0)
    if args.bf16:
        model = model.to(torch.bfloat16)
    model = _parallelize(model.to(device), mesh, args)
    opt = LuminaMoon(model.parameters(), lr=args.lr, betas=(0.9, 0.95), clip=4.0, seed=1234)
    placements = sorted({str(tuple(p.placements)) for p in model.parameters()})

    start = 0
    if args.resume:
        state = {"model": get_model_state_dict(model),
                 "optim": get_optimizer_state_dict(model, opt), "step": torch.zeros(())}
        dcp.load(state, checkpoint_id=args.ckpt)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, optim_state_dict=state["optim"])
        start = int(state["step"])

    train_blocks, _ = token_blocks(args.text_bytes, args.block_size)
    x_all, y_all = split_blocks(train_blocks)
    dp_rank = mesh["dp"].get_local_rank()
    losses = []
    for step in range(start, start + args.steps):
        # every tp rank of a dp rank sees the same batch; the dp ranks see different ones
        gen = torch.Generator().manual_seed(1000 * step + dp_rank)
        idx = torch.randint(0, len(x_all), (args.batch_size,), generator=gen)
        x, y = x_all[idx].to(device), y_all[idx].to(device)
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        value = loss.detach().float()
        dist.all_reduce(value, group=mesh["dp"].get_group())
        losses.append(float(value) / args.dp)
        if rank == 0:
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}", flush=True)
        if (step + 1) % args.save_every == 0:
            dcp.save({"model": get_model_state_dict(model),
                      "optim": get_optimizer_state_dict(model, opt),
                      "step": torch.tensor(float(step + 1))}, checkpoint_id=args.ckpt)
    result = dict(losses=losses, skipped=int(opt.skipped_steps), placements=placements,
                  start=start, world=world)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    # No rank leaves while another still works. gloo's destroy_process_group can then still wait
    # forever for a peer that has exited (pytorch/pytorch#75097; seen here with torch 2.4 and 2.7,
    # about one launch in 16): every rank is past the barrier and the checkpoint is written, so
    # a rank still inside it after 30 s leaves.
    dist.barrier()
    guard = threading.Timer(30.0, os._exit, args=(0,))
    guard.daemon = True
    guard.start()
    dist.destroy_process_group()
    guard.cancel()
    return result


if __name__ == "__main__":
    main()
