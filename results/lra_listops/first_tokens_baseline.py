#!/usr/bin/env python3
"""The accuracy of a lookup on an expression's first tokens, for results/lra_listops/README.md.

Reads the task's own expressions (`ablate data listops --length 32-128`: the training and test splits the
recipe trains and tests on, data_seed 0) and predicts each test label as the most common training label
among expressions with the same outermost operator (then: the same operator and the token after it).
Run from the repository root after a build: python3 results/lra_listops/first_tokens_baseline.py
"""
import collections
import json
import subprocess


def split(name, n):
    out = subprocess.run(
        ["target/release/ablate", "data", "listops", "--n", str(n), "--split", name, "--length", "32-128"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


train, test = split("train", 20000), split("test", 2000)
majority = collections.Counter(x["label"] for x in train).most_common(1)[0][0]
for name, key in [
    ("majority class", lambda tokens: ()),
    ("outermost operator", lambda tokens: (tokens[0],)),
    ("outermost operator + the token after it", lambda tokens: (tokens[0], tokens[1])),
]:
    table = collections.defaultdict(collections.Counter)
    for x in train:
        table[key(x["input"].split())][x["label"]] += 1
    guess = lambda k: table[k].most_common(1)[0][0] if k in table else majority
    right = sum(guess(key(x["input"].split())) == x["label"] for x in test)
    print(f"{name}: {right / len(test):.4f} test accuracy ({right} of {len(test)})")
