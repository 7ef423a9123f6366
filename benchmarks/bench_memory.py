"""benchmarks/bench_memory.py: peak GPU memory and step time of a GPT-2-like model trained with
LuminaMoon's normal step, the step inside backward, CPU offload, and both; torch's fused AdamW,
torch's in-backward recipe (post-accumulate-grad hooks, one AdamW per parameter) and torchao's
CPUOffloadOptimizer beside them, in the same process on the same data.

    PYTHONPATH=python python benchmarks/bench_memory.py --out benchmarks/results/DATE-memory
    PYTHONPATH=python python benchmarks/bench_memory.py --quick --device cpu --out /tmp/m  # smoke

Cases: ``gpt2-small`` (12 layers, d 768, 12 heads, vocab 50257, 124 M parameters; batch 8 x 256
tokens) and ``large``, sized from the card: the smallest GPT-like model whose fp32 training with
a normal step (16 B a parameter: weights, gradients, two moments) needs 10 % more than the card
holds, while offload needs 4 B a parameter on the card and 16 in host memory (checked against
the host's memory before it runs). Columns: peak = torch.cuda.max_memory_allocated over the
timed steps (state included), ms/step = wall time of forward + backward + step (median of the
timed steps, the device synchronised around each), loss = the last step's, vs normal = the
largest relative difference of the losses from LuminaMoon's normal step ("bitwise" when equal).
The model is written here (no downloads); the tokens are random.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # the installed package (with its compiled engine, which offload steps with), else this
    import luminamoon  # tree's sources
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import luminamoon  # noqa: E402
from luminamoon import LuminaMoon  # noqa: E402

GiB = 2**30


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2's layout: token and position embeddings, pre-norm blocks, a head tied to the token
    embedding."""

    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def gpt_params(vocab, ctx, d, layers) -> int:
    return vocab * d + ctx * d + layers * (12 * d * d + 13 * d) + 2 * d


CASES = {
    "gpt2-small": dict(vocab=50257, ctx=1024, d=768, layers=12, heads=12, batch=8, seq=256),
    "quick": dict(vocab=256, ctx=64, d=64, layers=2, heads=4, batch=2, seq=32),
}


def large_case(card_bytes: int, host_bytes: int):
    """d = 4096 (32 heads), layers chosen so that 16 B a parameter exceed the card by 10 %;
    None (with the reason) when the host cannot hold 16 B a parameter (+15 %)."""
    d, vocab, ctx = 4096, 50257, 1024
    per_layer = 12 * d * d + 13 * d
    base = gpt_params(vocab, ctx, d, 0)
    layers = math.ceil((1.10 * card_bytes / 16 - base) / per_layer)
    n = gpt_params(vocab, ctx, d, layers)
    case = dict(vocab=vocab, ctx=ctx, d=d, layers=layers, heads=32, batch=1, seq=512)
    if 16 * n * 1.15 > host_bytes:
        return None, (f"large: {n / 1e9:.2f} B parameters need {16 * n * 1.15 / GiB:.0f} GiB of "
                      f"host memory for offload, the host has {host_bytes / GiB:.0f} GiB")
    return case, None


def host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


# ----------------------------------------------------------------------------------------
# the methods: each returns (model, after_backward) where after_backward(model) finishes a step
# ----------------------------------------------------------------------------------------
LR = 3e-4


def _lm(model, **kw):
    return dict(lr=LR, seed=1234, **kw)


def m_normal(model, dev):
    opt = LuminaMoon(model.parameters(), **_lm(model))
    return lambda: (opt.step(), opt.zero_grad(set_to_none=True)), None


def m_in_backward(model, dev):
    ib = luminamoon.step_in_backward(model, **_lm(model))
    return ib.step, ib


def m_offload(model, dev):
    off = luminamoon.offload(model, **_lm(model))
    return off.step, off


def m_offload_in_backward(model, dev):
    off = luminamoon.offload(model, in_backward=True, **_lm(model))
    return off.step, off


def m_torch_fused(model, dev):
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=dev.type == "cuda")
    return lambda: (opt.step(), opt.zero_grad(set_to_none=True)), None


def m_torch_in_backward(model, dev):
    """torch's tutorial recipe: one optimizer per parameter, stepped by its post-accumulate-grad
    hook, which then frees the gradient."""
    opts = {p: torch.optim.AdamW([p], lr=LR, fused=dev.type == "cuda")
            for p in model.parameters()}

    def hook(p):
        opts[p].step()
        opts[p].zero_grad(set_to_none=True)

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]

    class Hooks:
        @staticmethod
        def remove():
            for h in handles:
                h.remove()

    return (lambda: None), Hooks


def m_torchao_offload(model, dev):
    from torchao.optim import CPUOffloadOptimizer

    opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=LR, fused=True)
    return lambda: (opt.step(), opt.zero_grad()), None


METHODS = {
    "luminamoon": m_normal,
    "luminamoon-in-backward": m_in_backward,
    "luminamoon-offload": m_offload,
    "luminamoon-offload-in-backward": m_offload_in_backward,
    "torch-adamw-fused": m_torch_fused,
    "torch-in-backward": m_torch_in_backward,
    "torchao-cpu-offload": m_torchao_offload,
}
# the methods whose losses are LuminaMoon's math (compared with its normal step)
SAME_MATH = {"luminamoon-in-backward", "luminamoon-offload", "luminamoon-offload-in-backward"}
# what runs on the large case: the normal steps to show they do not fit, the offloads
LARGE = ["luminamoon", "torch-adamw-fused", "luminamoon-offload",
         "luminamoon-offload-in-backward", "torchao-cpu-offload"]


def available(name: str, dev: torch.device) -> str | None:
    """None, or why ``name`` cannot run here."""
    if name == "torchao-cpu-offload":
        if dev.type != "cuda":
            return "needs CUDA"
        try:
            from torchao.optim import CPUOffloadOptimizer  # noqa: F401
        except ImportError as exc:
            return f"torchao not importable ({exc})"
    return None


def free_memory(dev) -> None:
    """What a finished run held: its reference cycles (hooks and their owners), the GPU cache,
    and torch's cache of pinned host memory (an offload's gigabytes, which the next method's
    allocations of other sizes would not reuse)."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(name: str, case: dict, dev: torch.device, warmup: int, steps: int, batches):
    torch.manual_seed(0)
    with dev:  # built where it trains: a multi-billion-parameter model initialises in seconds
        model = GPT(case["vocab"], case["ctx"], case["d"], case["layers"], case["heads"])
    finish, keep = METHODS[name](model, dev)
    losses, times = [], []
    for i, idx in enumerate(batches[:warmup + steps]):
        if i == warmup:
            _sync(dev)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
        _sync(dev)
        t0 = time.perf_counter()
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               idx[:, 1:].reshape(-1))
        loss.backward()
        finish()
        _sync(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if hasattr(keep, "wait"):
        keep.wait()
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    if hasattr(keep, "remove"):
        keep.remove()
    del model, keep, finish
    free_memory(dev)
    return dict(peak=peak, ms=1e3 * statistics.median(times), losses=losses)


def compare(losses, normal) -> str:
    if normal is None:
        return ""
    if losses == normal:
        return "bitwise"
    return f"{max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, normal)):.2e}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny model, 1+2 steps (CPU smoke)")
    ap.add_argument("--cases", default=None, help="gpt2-small,large (default both; quick: quick)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="sequences a step (gpt2-small)")
    ap.add_argument("--seq", type=int, default=None, help="tokens a sequence (gpt2-small)")
    ap.add_argument("--out", default=None, help="path prefix: writes PREFIX.csv and PREFIX.md")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    cases = (args.cases or ("quick" if args.quick else "gpt2-small,large")).split(",")
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    steps = args.steps if args.steps is not None else (2 if args.quick else 10)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    where = (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu")
    print(f"# bench_memory on {where}, torch {torch.__version__}, luminamoon "
          f"{luminamoon.__version__}, {warmup} warm-up + {steps} timed steps")
    rows = []
    stamp = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                 device=where, torch=torch.__version__, luminamoon=luminamoon.__version__)
    for case_name in cases:
        if case_name == "large":
            if dev.type != "cuda":
                print("large: needs CUDA, skipped")
                continue
            card, host = torch.cuda.get_device_properties(dev).total_memory, host_memory()
            case, why = large_case(card, host)
            if case is None and host:
                # a card larger than the host can mirror (an H200 beside 128 GiB): the card is
                # capped (torch's per-process memory fraction) at what the host can mirror
                cap = int(host / 1.15 / 1.10 * 0.8)
                torch.cuda.set_per_process_memory_fraction(cap / card, dev)
                print(f"large: the card's {card / GiB:.0f} GiB capped at {cap / GiB:.0f} GiB "
                      f"(the host's {host / GiB:.0f} GiB hold 16 B a parameter of a model 10 % "
                      f"larger than that)")
                case, why = large_case(cap, host)
            if case is None:
                print(why)
                continue
            todo = [m for m in LARGE if m in methods]
            n_steps, n_warm = min(steps, 3), 1
        else:
            case, todo, n_steps, n_warm = dict(CASES[case_name]), methods, steps, warmup
            if case_name == "gpt2-small":
                case["batch"] = args.batch or case["batch"]
                case["seq"] = min(args.seq or case["seq"], case["ctx"])
        n = gpt_params(case["vocab"], case["ctx"], case["d"], case["layers"])
        print(f"\n## {case_name}: {n / 1e6:.1f} M parameters, batch {case['batch']} x "
              f"{case['seq']} tokens (fp32 weights, gradients {4 * n / GiB:.2f} GiB, AdamW "
              f"state {8 * n / GiB:.2f} GiB)")
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, case["vocab"], (case["batch"], case["seq"] + 1),
                                 generator=gen).to(dev) for _ in range(n_warm + n_steps)]
        normal = None
        print(f"{'method':32s} {'peak GiB':>9s} {'ms/step':>9s} {'loss':>9s} {'vs normal':>10s}")
        for name in todo:
            why = available(name, dev)
            result = None
            if why is None:
                try:
                    result = run(name, case, dev, n_warm, n_steps, batches)
                except torch.cuda.OutOfMemoryError:
                    why = "out of memory"
            if why is not None:
                free_memory(dev)  # the failed run's frames (its model) go with the traceback
            if result is None:
                print(f"{name:32s} {why}")
                rows.append(dict(case=case_name, params=n, method=name, peak_gib="",
                                 ms_per_step="", loss="", vs_normal="", note=why, **stamp))
                continue
            if name == "luminamoon":
                normal = result["losses"]
            vs = compare(result["losses"], normal) if name in SAME_MATH else ""
            peak = "" if result["peak"] is None else f"{result['peak'] / GiB:.2f}"
            print(f"{name:32s} {peak or '-':>9s} {result['ms']:9.1f} "
                  f"{result['losses'][-1]:9.4f} {vs:>10s}")
            rows.append(dict(case=case_name, params=n, method=name, peak_gib=peak,
                             ms_per_step=f"{result['ms']:.1f}",
                             loss=f"{result['losses'][-1]:.6f}", vs_normal=vs, note="",
                             **stamp))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        fields = list(rows[0]) if rows else ["case"]
        with open(args.out + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        with open(args.out + ".md", "w") as f:
            f.write(f"bench_memory on {where}, torch {torch.__version__}\n\n")
            f.write("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields) + "\n")
            for r in rows:
                f.write("| " + " | ".join(str(r[k]) for k in fields) + " |\n")
        print(f"\nwrote {args.out}.csv and {args.out}.md")
    return rows


if __name__ == "__main__":
    main()
