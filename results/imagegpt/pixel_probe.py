"""Reference for the ImageGPT linear probe: the same probe on raw pixels instead of model features.

Logistic regression (standardised inputs, 500 full-batch Adam steps at lr 0.05, weight decay 1e-4, as
ablate's probe) fitted on 10,000 training images averaged over 2x2 blocks (14x14 = 196 values, the
ImageGPT recipe's resolution), scored on the first 2,000 test images (the images ablate evaluates).
Run: PYTHONPATH=~/.cache/ablate/torch-2.11.0 python3 results/imagegpt/pixel_probe.py
"""
import gzip
import os

import torch
import torch.nn.functional as F

d = os.path.expanduser("~/.cache/ablate/data/fashion-mnist")


def idx(name):
    raw = gzip.open(f"{d}/{name}.gz").read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim :]), dtype=torch.uint8).reshape(dims)


torch.manual_seed(0)
xs, ys = idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte").long()
xt, yt = idx("t10k-images-idx3-ubyte")[:2000], idx("t10k-labels-idx1-ubyte")[:2000].long()
pick = torch.randperm(len(xs))[:10000]
xs, ys = xs[pick], ys[pick]


def features(x):
    return F.avg_pool2d(x.float().unsqueeze(1), 2).flatten(1)


fs, ft = features(xs), features(xt)
mean, std = fs.mean(0, keepdim=True), fs.std(0, keepdim=True).clamp_min(1e-6)
fs, ft = (fs - mean) / std, (ft - mean) / std
probe = torch.nn.Linear(fs.shape[1], 10)
opt = torch.optim.Adam(probe.parameters(), lr=0.05, weight_decay=1e-4)
for _ in range(500):
    opt.zero_grad()
    F.cross_entropy(probe(fs), ys).backward()
    opt.step()
accuracy = (probe(ft).argmax(-1) == yt).float().mean().item()
print(f"linear probe on 14x14 pixels: test accuracy {accuracy:.4f}")
