"""One run of `recipes/heads.yaml` as a researcher would write it in PyTorch eager: the character-level World
English Bible (the file ablate caches; the last 10% of its characters held out), a 4-layer post-LN GPT
(learned positions, GELU, untied output head, fused SDPA with is_causal), AdamW (0.9, 0.99, weight decay 0.1 on
matrices, fused), clipping at 1.0, linear warm-up then cosine decay to min_lr, held-out loss on `eval_batches`
random batches every `eval_interval` steps and at the end. Prints the final held-out loss and the run's wall
time. `bench/heads_end_to_end.sh` loops it over the recipe's 15 runs."""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = self.ln1(x + self.out(a.transpose(1, 2).contiguous().view(b, n, d)))  # post-LN
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, h, layers, block):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(block, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1500)
    a = p.parse_args()
    start = time.perf_counter()
    d, layers, block, batch = 128, 4, 64, 12
    lr, min_lr, warmup, eval_interval, eval_batches = 1e-3, 1e-4, 100, 100, 10
    text = open(os.path.expanduser("~/.cache/ablate/data/web-bible.txt"), encoding="utf-8").read()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in chars], dtype=torch.long)  # the vocabulary
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    cut = int(len(data) * 0.9)
    train, val = data[:cut], data[cut:]
    torch.manual_seed(a.seed)
    model = GPT(len(ids), d, a.heads, layers, block)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99), fused=True)

    def batch_of(split):
        i = torch.randint(len(split) - block - 1, (batch,))
        x = torch.stack([split[j:j + block] for j in i])
        y = torch.stack([split[j + 1:j + 1 + block] for j in i])
        return x, y

    @torch.no_grad()
    def held_out():
        model.eval()
        loss = sum(model(*batch_of(val)).item() for _ in range(eval_batches)) / eval_batches
        model.train()
        return loss

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, a.steps - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))

    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(*batch_of(train))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % eval_interval == 0 and step + 1 < a.steps:
            held_out()
    final = held_out()
    print(f"heads={a.heads} seed={a.seed}: val_loss {final:.4f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
