"""PyTorch eager reference for `ablate bench`: the same GPT (pre-LN, GELU, learned positions, tied
embeddings, biases, fused SDPA with is_causal) and the same step (cross-entropy, backward, global-norm
clipping at 1.0, fused AdamW), timed the same way: warm-up steps, then the mean over timed steps."""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h, layers):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        for lin, std in [(self.qkv, 0.02), (self.out, 0.02 / math.sqrt(2 * layers)),
                         (self.up, 0.02), (self.down, 0.02 / math.sqrt(2 * layers))]:
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).contiguous().view(b, n, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, h, layers, block):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(block, d) * 0.02)
        nn.init.normal_(self.tok.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(d, h, layers) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("heads", 4), ("d-model", 128), ("block", 64), ("batch", 12),
                          ("vocab", 65), ("warmup", 10), ("steps", 50)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = GPT(a.vocab, a.d_model, a.heads, a.layers, a.block).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), fused=True)
    x = torch.randint(a.vocab, (a.batch, a.block), device=dev)
    y = torch.randint(a.vocab, (a.batch, a.block), device=dev)

    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(dev.type, enabled=a.precision == "fp16")

    def step():
        with torch.autocast(dev.type, dtype=low or torch.float32, enabled=low is not None):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.item()

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(f"pytorch eager {a.layers}L/{a.heads}H/d{a.d_model} T={a.block} B={a.batch} {a.precision} {a.device}: "
          f"{a.steps * a.batch * a.block / secs:.0f} tokens/s, {secs * 1000 / a.steps:.2f} ms/step, {params} params")


if __name__ == "__main__":
    main()
