"""The ``perf`` directive: a table and a chart made from one benchmarks/results/ CSV at build time.

Usage in a MyST page::

    ```{perf} ../benchmarks/results/2026-12-06-h100-sr-final.csv
    :caption: One step, % of the copy ceiling (H100)
    ```

The CSV is what ``benchmarks/bench_step.py`` writes: one row per (case, mode, impl) with
``us_per_step`` and ``ceiling_fraction`` (bytes an element by the spec's count, over the time,
against a device-to-device copy measured in the same run). The table shows every implementation
of each case and mode side by side, time and % of the copy ceiling; the chart (matplotlib, PNG in
docs/_generated/) shows the % of the copy ceiling per case, one bar per implementation. Nothing
is typed by hand: a new results file is a new directive.
"""
from __future__ import annotations

import csv
import os
from collections import OrderedDict

from docutils.parsers.rst import Directive, directives

GENERATED = "_generated"
# The order of the implementations in tables and charts: LuminaMoon first, then the peers.
ORDER = ["luminamoon-triton", "luminamoon-aot", "torch-adamw-fused", "torch-adamw-foreach",
         "torchao-adamw-bf16sr", "optimi-adamw"]
LABELS = {"luminamoon-triton": "LuminaMoon", "luminamoon-aot": "LuminaMoon (aot)",
          "torch-adamw-fused": "torch AdamW fused", "torch-adamw-foreach": "torch AdamW foreach",
          "torchao-adamw-bf16sr": "torchao bf16 SR AdamW", "optimi-adamw": "optimi AdamW"}


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def pivot(rows):
    """{(case, mode): {impl: row}} in file order, and the implementations present, in ORDER."""
    table = OrderedDict()
    impls = []
    for r in rows:
        table.setdefault((r["case"], r["mode"]), {})[r["impl"]] = r
        if r["impl"] not in impls:
            impls.append(r["impl"])
    impls.sort(key=lambda i: (ORDER.index(i) if i in ORDER else len(ORDER), i))
    return table, impls


def chart(table, impls, title, out_png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(table)
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(keys) + 1.6))
    for k, impl in enumerate(impls):
        ys = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(keys))]
        xs = [100 * float(table[key][impl]["ceiling_fraction"]) if impl in table[key] else 0
              for key in keys]
        ax.barh(ys, xs, height=width, label=LABELS.get(impl, impl))
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"{c}  {m}" for c, m in keys], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(100, color="black", linewidth=0.8)
    ax.set_xlabel("% of the copy ceiling (higher is better)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.7 / (0.42 * len(keys) + 1.6)),
              ncol=len(impls), frameon=False)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def table_md(table, impls):
    """A Markdown table (the directive's content is parsed by MyST in .md pages)."""
    head = ["case", "mode"] + [LABELS.get(i, i) for i in impls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * len(impls)]
    for (case, mode), by_impl in table.items():
        cells = [case, mode]
        for impl in impls:
            r = by_impl.get(impl)
            cells.append("–" if r is None else
                         f"{float(r['us_per_step']):.1f}\u00a0us ({100 * float(r['ceiling_fraction']):.1f}\u00a0%)")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


class PerfDirective(Directive):
    required_arguments = 1
    option_spec = {"caption": directives.unchanged}
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        rel = self.arguments[0]
        src_dir = os.path.dirname(env.doc2path(env.docname))
        path = os.path.normpath(os.path.join(src_dir, rel))
        if not os.path.isfile(path):
            raise self.error(f"perf: no results file {path}")
        env.note_dependency(path)
        rows = read_rows(path)
        table, impls = pivot(rows)
        first = rows[0]
        caption = self.options.get("caption", os.path.basename(path))
        title = f"{caption}: {first['device']}, torch {first['torch']}, Triton {first['triton']}, {first['date']}"
        os.makedirs(os.path.join(env.srcdir, GENERATED), exist_ok=True)
        stem = os.path.splitext(os.path.basename(path))[0]
        chart(table, impls, title, os.path.join(env.srcdir, GENERATED, stem + ".png"))
        lines = [f"**{title}** (from `{os.path.relpath(path, os.path.dirname(env.srcdir))}`; "
                 "us a step and % of the copy ceiling measured in the same run)", ""]
        lines += table_md(table, impls)
        lines += ["", f"```{{image}} /{GENERATED}/{stem}.png", f":alt: {title}", "```", ""]
        from docutils.statemachine import StringList
        from docutils import nodes

        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=path), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("perf", PerfDirective)
    return {"parallel_read_safe": True, "version": "1"}
