"""benchmarks/bench_q8_quality.py: what q8 moments cost in quality, on a GPT-2-small-sized model.

A GPT with GPT-2 small's body (12 layers, d 768, 12 heads: bench_memory.GPT, its head tied to
the token embedding) learns the standard library's own sources character by character (the
demo's data, luminamoon.demo.data: a character vocabulary of about 100 symbols, so 85 M
parameters, GPT-2 small's without its 50257-token embedding). Every run starts from the same
weights and sees the same batches in the same order; LuminaMoon's runs share the seed of their
rounding streams. Runs:
- lumina-fp32m:  LuminaMoon, float32 moments (the baseline of the comparison)
- lumina-q8:     LuminaMoon, q8 moments (state_dtype="q8")
- torchao-8bit:  torchao's AdamW8bit (torchao.optim, blocks of 256)
- torch-adamw:   torch's AdamW (fused where this torch has it), a reference
and on request (--runs) lumina-q8-adamw: LuminaMoon with q8 moments in its AdamW mode (clip 0,
non-finite gradients propagated), the same update rule as torchao's, so that the two 8-bit
stores are compared alone.
All with the same lr schedule (linear warm-up, cosine decay to 10 %), betas, eps and weight
decay; LuminaMoon with its defaults otherwise (TDCLM: clip 4, non-finite steps skipped).

Precision: float32 weights and moments' master copy, forward and backward under bf16 autocast on
CUDA (float32 on CPU), as a mixed-precision GPT-2 run keeps them. Size: 2000 steps of 16
sequences of 256 characters (4096 tokens a step, 8.2 M tokens a run): on one H100 a run takes
about 40 s of training plus its evaluations (torchao's first step compiles its kernels), so the
four runs fit in about 4 minutes.

Reports the validation loss (--eval-batches fixed batches of the held-out modules) every
--eval-every steps and at the end, each run's final loss relative to lumina-fp32m's, tokens/s
of the training steps after the first --timing-warmup, and the state bytes a parameter (the
storages of the optimizer's state); writes PREFIX.csv (every evaluation) and PREFIX.md (the
table) with --out PREFIX. A run that cannot run here (torchao not installed) gets a row saying
why.

    PYTHONPATH=python python benchmarks/bench_q8_quality.py --out benchmarks/results/DATE-q8
    PYTHONPATH=python python benchmarks/bench_q8_quality.py --quick --device cpu --out /tmp/q

--model demo makes the same comparison on the demo's model (luminamoon.demo's TinyGPT, its
sizes, 400 steps, its lr, betas and weight decay; this benchmark's schedule), for the CPU:

    PYTHONPATH=python python benchmarks/bench_q8_quality.py --model demo --device cpu --out q8
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_memory import GPT  # noqa: E402  (imports the installed luminamoon, else python/)

import luminamoon  # noqa: E402
from luminamoon import LuminaMoon  # noqa: E402
from luminamoon.bench import state_nbytes  # noqa: E402
from luminamoon.demo.data import CharVocab, stdlib_sources  # noqa: E402

# (option, default, default with --quick)
SIZES = (("steps", 2000, 40), ("layers", 12, 2), ("d-model", 768, 64), ("heads", 12, 4),
         ("seq", 256, 32), ("batch", 16, 8), ("eval-every", 250, 20), ("eval-batches", 16, 4),
         ("warmup", 100, 10), ("timing-warmup", 20, 5), ("train-bytes", 4_000_000, 200_000),
         ("val-bytes", 400_000, 40_000))
# --model demo: the demo's model and sizes (luminamoon.demo: Config's defaults, its TinyGPT
# with an untied head), its lr, betas and weight decay, for the same comparison on the CPU
DEMO = dict(steps=400, layers=2, d_model=128, heads=4, seq=64, batch=16, eval_every=50,
            eval_batches=8, warmup=30, timing_warmup=10, train_bytes=1_200_000,
            val_bytes=150_000, lr=1e-3, betas="0.9,0.99", weight_decay=0.01)
RUNS = ("lumina-fp32m", "lumina-q8", "torchao-8bit", "torch-adamw")
MORE_RUNS = ("lumina-q8-adamw",)
BASELINE = "lumina-fp32m"
# the quality targets: q8 within 0.5 % of float32 moments, and no worse than torchao's 8-bit
Q8_TOLERANCE = 0.005


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="auto", help="LuminaMoon's backend (default auto)")
    ap.add_argument("--runs", default=",".join(RUNS),
                    help=f"comma-separated, of {RUNS + MORE_RUNS} (default the first four)")
    for name, full, quick in SIZES:
        ap.add_argument(f"--{name}", type=int, default=None,
                        help=f"default {full} ({quick} with --quick)")
    ap.add_argument("--model", choices=("gpt2", "demo"), default="gpt2",
                    help="gpt2: bench_memory's GPT of GPT-2 small's body (default); demo: the "
                         "demo's model, sizes and hyperparameters (400 steps, for the CPU)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default 6e-4)")
    ap.add_argument("--betas", default=None, help="default 0.9,0.95")
    ap.add_argument("--weight-decay", type=float, default=None, help="default 0.1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                    help="bf16 autocast of forward and backward (auto: on CUDA)")
    ap.add_argument("--quick", action="store_true", help="a tiny model, 40 steps (CPU smoke)")
    ap.add_argument("--out", default=None, help="path prefix: writes PREFIX.csv and PREFIX.md")
    args = ap.parse_args(argv)
    defaults = dict(lr=6e-4, betas="0.9,0.95", weight_decay=0.1)
    for name, full, quick in SIZES:
        defaults[name.replace("-", "_")] = quick if args.quick else full
    if args.model == "demo":
        defaults.update(DEMO)
    for attr, value in defaults.items():
        if getattr(args, attr) is None:
            setattr(args, attr, value)
    unknown = [r for r in args.runs.split(",") if r not in RUNS + MORE_RUNS]
    if unknown:
        ap.error(f"--runs: unknown {unknown}; choose from {', '.join(RUNS + MORE_RUNS)}")
    if args.steps < 2 * args.timing_warmup:
        ap.error(f"--steps must be >= 2 x --timing-warmup ({2 * args.timing_warmup}), got "
                 f"{args.steps}")
    args.betas = tuple(float(b) for b in args.betas.split(","))
    return args


class Data:
    """The demo's text as character ids on the device, and every run's batches."""

    def __init__(self, args, device: torch.device):
        train, val, self.train_files, self.val_files = stdlib_sources(args.train_bytes,
                                                                      args.val_bytes)
        self.vocab = CharVocab(train)
        self.train = self.vocab.encode(train).to(device)
        self.val = self.vocab.encode(val).to(device)
        gen = torch.Generator().manual_seed(args.seed)
        span = args.seq + 1
        self.offsets = torch.randint(0, len(self.train) - span, (args.steps, args.batch),
                                     generator=gen)
        self.val_offsets = torch.randint(0, len(self.val) - span,
                                         (args.eval_batches, args.batch), generator=gen)
        self.window = torch.arange(span, device=device)

    def batch(self, data, offsets):
        rows = data[offsets.to(data.device)[:, None] + self.window]
        return rows[:, :-1], rows[:, 1:]


def make_model(args, vocab: int):
    """The run's model on the CPU, initialised from the global seed."""
    if args.model == "demo":
        from luminamoon.demo.config import Config
        from luminamoon.demo.model import make_model_class

        cfg = Config(d_model=args.d_model, n_layer=args.layers, n_head=args.heads, ctx=args.seq)
        return make_model_class()(vocab, cfg)
    return GPT(vocab, args.seq, args.d_model, args.layers, args.heads)


def make_optimizer(run: str, params, args):
    """The run's optimizer, or raises (ImportError for a peer that is not installed)."""
    common = dict(lr=args.lr, betas=args.betas, weight_decay=args.weight_decay)
    if run.startswith("lumina-"):
        adamw_mode = dict(clip=0.0, nonfinite="propagate") if run.endswith("-adamw") else {}
        return LuminaMoon(params, state_dtype="q8" if "q8" in run else torch.float32,
                          seed=args.seed, backend=args.backend, **adamw_mode, **common)
    if run == "torchao-8bit":
        from torchao.optim import AdamW8bit

        return AdamW8bit(params, **common)
    fused = torch.device(args.device).type == "cuda"
    return torch.optim.AdamW(params, fused=fused, foreach=not fused, **common)


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def set_lr(opt, value: float) -> None:
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):  # torchao keeps it a tensor: fill in place
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def backend_of(opt) -> str:
    plan = getattr(opt, "_plan", None)
    if plan is not None and getattr(plan, "backends", None):
        return "/".join(sorted({b.name for b in plan.backends}))
    if getattr(opt, "defaults", {}).get("fused"):
        return "torch fused"
    return type(opt).__module__.split(".")[0]


def train(run: str, args, data: Data, device: torch.device, init_state) -> dict:
    model = make_model(args, len(data.vocab)).to(device)
    model.load_state_dict(init_state)
    opt = make_optimizer(run, list(model.parameters()), args)
    amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    losses = torch.zeros(args.steps, device=device)
    curve = []  # (step, train loss mean since the last evaluation, val loss)

    def evaluate() -> float:
        model.eval()
        total = torch.zeros((), device=device)
        with torch.no_grad(), autocast:
            for offsets in data.val_offsets:
                x, y = data.batch(data.val, offsets)
                total += F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        model.train()
        return float(total) / len(data.val_offsets)

    curve.append((0, math.nan, evaluate()))
    timed, timed_steps, mark = 0.0, 0, None
    for step in range(args.steps):
        if step == args.timing_warmup:
            sync()
            mark = time.perf_counter()
        set_lr(opt, lr_at(step, args))
        x, y = data.batch(data.train, data.offsets[step])
        with autocast:
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = loss.detach()
        done = step + 1
        if done % args.eval_every == 0 or done == args.steps:
            sync()
            if mark is not None:
                timed += time.perf_counter() - mark
                timed_steps = done - args.timing_warmup
            last = curve[-1][0]
            curve.append((done, float(losses[last:done].mean()), evaluate()))
            print(f"  {run:<14} step {done:>5}  train {curve[-1][1]:.4f}  val "
                  f"{curve[-1][2]:.4f}", flush=True)
            if mark is not None:
                mark = time.perf_counter()
    tokens_per_s = timed_steps * args.batch * args.seq / timed if timed > 0 else math.nan
    n_params = sum(p.numel() for p in model.parameters())
    return dict(curve=curve, tokens_per_s=tokens_per_s, backend=backend_of(opt),
                state_bpp=state_nbytes(opt) / n_params, n_params=n_params)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    data = Data(args, device)
    torch.manual_seed(args.seed)
    init_state = {k: v.detach().clone() for k, v in
                  make_model(args, len(data.vocab)).state_dict().items()}
    n_params = sum(v.numel() for k, v in init_state.items())
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")
    stamp = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                 device=where, torch=torch.__version__, luminamoon=luminamoon.__version__)
    what = "the demo's GPT" if args.model == "demo" else "GPT"
    head = (f"bench_q8_quality on {where}, torch {torch.__version__}, luminamoon "
            f"{luminamoon.__version__}: {what} {args.layers} layers, d {args.d_model}, "
            f"{args.heads} heads, {n_params:,} parameters, vocabulary {len(data.vocab)} "
            f"characters; {args.steps} steps of {args.batch} x {args.seq} tokens, "
            f"{'bf16 autocast' if amp else 'float32'}, lr {args.lr:g}, betas {args.betas}, "
            f"weight decay {args.weight_decay:g}, seed {args.seed}; {len(data.train):,} "
            f"training / {len(data.val):,} validation characters")
    print(f"# {head}", flush=True)
    results, notes = {}, {}
    for run in args.runs.split(","):
        t0 = time.perf_counter()
        notes[run] = q8_blocker(args, device) if run.startswith("lumina-q8") else None
        if notes[run] is None:
            try:
                results[run] = train(run, args, data, device, init_state)
                results[run]["seconds"] = time.perf_counter() - t0
            except ImportError as exc:  # a peer that is not installed here: say why
                notes[run] = f"not run: {type(exc).__name__}: {exc}"
        if notes[run] is not None:
            print(f"  {run:<14} {notes[run]}", flush=True)
        # the report so far, after every run (a run cut short by a time limit leaves the others')
        report(args, results, notes, head, stamp, final=run == args.runs.split(",")[-1])
    finite = all(math.isfinite(r["curve"][-1][2]) for r in results.values())
    return 0 if finite and results else 1


def q8_blocker(args, device: torch.device) -> str | None:
    """On CUDA with backend "auto": None where a GPU backend steps q8 moments, else why not
    ("auto" would hand them to the reference backend, an oracle far slower than this
    benchmark's time: --backend reference runs every LuminaMoon run there)."""
    if device.type != "cuda" or args.backend != "auto":
        return None
    p = torch.zeros(4096, device=device, requires_grad=True)
    p.grad = torch.ones_like(p)
    try:
        LuminaMoon([p], state_dtype="q8", backend="triton").step()
    except Exception as exc:  # noqa: BLE001 - the reason is the run's row
        why = str(exc).split(" (")[0].split("; ")[0]
        return (f"not run: {type(exc).__name__}: {why} (the reference backend, which steps q8 "
                f"moments, is far too slow here: --backend reference runs it there)")
    return None


def report(args, results: dict, notes: dict, head: str, stamp: dict, final: bool) -> None:
    """Prints the table (final: with the verdicts) and writes PREFIX.csv and PREFIX.md."""
    runs = [r for r in args.runs.split(",") if r in results or notes.get(r)]
    base_curve = {s: v for s, _, v in results.get(BASELINE, {}).get("curve", [])}
    base = base_curve.get(args.steps, math.nan)
    rows, table = [], []
    for run in runs:
        if run not in results:
            table.append([run, "", "", "", "", "", "", notes[run]])
            rows.append(dict(run=run, backend="", step="", train_loss="", val_loss="",
                             rel_vs_fp32m="", tokens_per_s="", state_bytes_per_param="",
                             note=notes[run], **stamp))
            continue
        r = results[run]
        for step, train_loss, val in r["curve"]:
            rel = val / base_curve[step] - 1 if step in base_curve else math.nan
            rows.append(dict(run=run, backend=r["backend"], step=step,
                             train_loss=f"{train_loss:.5f}", val_loss=f"{val:.5f}",
                             rel_vs_fp32m=f"{rel:.5f}", tokens_per_s=f"{r['tokens_per_s']:.0f}",
                             state_bytes_per_param=f"{r['state_bpp']:.4f}", note="", **stamp))
        final_val = r["curve"][-1][2]
        table.append([run, r["backend"], f"{final_val:.4f}",
                      f"{100 * (final_val / base - 1):+.3f}%", f"{r['tokens_per_s']:,.0f}",
                      f"{r['state_bpp']:.3f}", f"{r['seconds']:.0f}", ""])
    verdicts = []
    if "lumina-q8" in results and BASELINE in results:
        q8 = results["lumina-q8"]["curve"][-1][2]
        rel = q8 / base - 1
        verdicts.append(f"q8 moments vs float32 moments: {100 * rel:+.3f}% (target within "
                        f"{100 * Q8_TOLERANCE:.1f}%: "
                        f"{'met' if abs(rel) <= Q8_TOLERANCE else 'MISSED'})")
    if "torchao-8bit" in results:
        ao = results["torchao-8bit"]["curve"][-1][2]
        for run, what in (("lumina-q8", "q8 moments"),
                          ("lumina-q8-adamw", "q8 moments, AdamW mode")):
            if run in results:
                val = results[run]["curve"][-1][2]
                verdicts.append(f"{what} {val:.4f} vs torchao AdamW8bit {ao:.4f}: "
                                f"{'no worse' if val <= ao else 'WORSE'}")
    header = ["run", "backend", "final val loss", "vs lumina-fp32m", "tokens/s",
              "state B/param", "seconds", "note"]
    if final:
        print(f"\n{'  '.join(header)}")
        for line in table:
            print("  ".join(line))
        for line in verdicts:
            print("- " + line)
    if args.out and rows:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        with open(args.out + ".md", "w") as f:
            f.write(head + "\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
            for line in table:
                f.write("| " + " | ".join(line) + " |\n")
            f.write("\n" + "".join(f"- {v}\n" for v in verdicts))
        if final:
            print(f"wrote {args.out}.csv and {args.out}.md")


if __name__ == "__main__":
    sys.exit(main())
