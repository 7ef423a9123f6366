"""`luminamoon demo`: what LuminaMoon is for, on a character-level transformer.

A small GPT learns to write Python, character by character, from the standard library's own
sources (nothing is downloaded). Every run of a comparison starts from the same initial weights
and sees the same batches in the same order:

  fp32       torch AdamW (the baseline) and LuminaMoon, float32 weights and moments, and
             LuminaMoon with q8 moments (one byte a moment and element, a float32 scale a
             block of 256), where the backend of the runs steps them (else its row says why);
  bf16       pure bfloat16 weights and moments: torch AdamW (rounds to nearest) against
             LuminaMoon with seeded stochastic rounding (and LuminaMoon rounding to nearest,
             the control that isolates the rounding);
  faults     float32, with injected faults, the same for both optimizers: three steps whose
             gradient of one layer is multiplied by 1e3; three poisoned batches (random
             characters, loss x1e3); then one step with a NaN in one gradient element. AdamW's
             weights turn NaN (its run ends there); LuminaMoon skips that step on the device.

It prints a progress bar per run and a table (validation loss, tokens/s and optimizer time per
step after the first ten steps, which pay for kernel compilation; the optimizer state's bytes a
parameter; skipped steps), times the
optimizer step alone on this model for every LuminaMoon backend that runs here beside torch's
AdamW, and writes to --out: loss_curves.png, step_time.png, results.md and results.csv.
"""
# Modules: config (Config), data (the sources), model (the GPT), runs (training and step
# timing), report (tables, findings, plots), cli (the command).
from .cli import (_progress_factory, build_parser, default_aot_bundle, main,  # noqa: F401
                  resolve_device)
from .config import QUICK, Config  # noqa: F401
from .data import UNK, CharVocab, stdlib_sources  # noqa: F401
from .model import make_model_class  # noqa: F401
from .report import (cpu_model, fault_response, findings, format_markdown,  # noqa: F401
                     format_text, machine_line, plot_losses, plot_step_times, results_table,
                     timing_table, usable_cores, write_csv)
from .runs import (RunResult, RunSpec, Session, StepTiming, adamw_flavour,  # noqa: F401
                   available_backends, run_specs, time_optimizer_steps, train)
