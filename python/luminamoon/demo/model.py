"""demo/model.py: the demo's model: a small character-level GPT."""
from __future__ import annotations

import math

from .config import Config

# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------


def make_model_class():
    """TinyGPT, defined on first use so that importing this module does not import torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def f32(t):
        # The weights may be stored in bf16; the arithmetic is float32 either way, so the runs
        # differ only in how the optimizer stores its results.
        return t if t.dtype == torch.float32 else t.float()

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, c = x.shape
            y = F.layer_norm(x, (c,), f32(self.ln1.weight), f32(self.ln1.bias))
            qkv = F.linear(y, f32(self.qkv.weight), f32(self.qkv.bias))
            q, k, v = qkv.view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, c), f32(self.proj.weight),
                             f32(self.proj.bias))
            y = F.layer_norm(x, (c,), f32(self.ln2.weight), f32(self.ln2.bias))
            y = F.gelu(F.linear(y, f32(self.fc.weight), f32(self.fc.bias)))
            return x + F.linear(y, f32(self.out.weight), f32(self.out.bias))

    class TinyGPT(nn.Module):
        """A pre-LayerNorm GPT: token and position embeddings, n_layer blocks, a linear head."""

        def __init__(self, vocab: int, cfg: Config):
            super().__init__()
            self.tok = nn.Embedding(vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.ctx, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
            self.lnf = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, vocab, bias=False)
            # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(
                        ("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            t = idx.shape[1]
            x = F.embedding(idx, f32(self.tok.weight)) + f32(self.pos.weight)[:t]
            for block in self.blocks:
                x = block(x)
            x = F.layer_norm(x, (x.shape[-1],), f32(self.lnf.weight), f32(self.lnf.bias))
            return F.linear(x, f32(self.head.weight))

    return TinyGPT
