"""How much of heads.yaml's seed-to-seed spread of test_loss is the test estimate's own noise.

Reads two runs of recipes/heads.yaml that train the same models (same seeds, same binary, same machine) and
differ only in the final test evaluation: `small/` with the recipe's 10 test batches (7,680 tokens) and
`whole/` with train.test_batches=all (the whole test split). Prints the tables of README.md.
Usage: python3 results/eval_noise/analyse.py SMALL_DIR WHOLE_DIR
"""
import csv
import statistics as st
import sys


def rows(path):
    with open(path + "/runs.csv") as f:
        return {r["run_id"]: r for r in csv.DictReader(f)}


small, whole = rows(sys.argv[1]), rows(sys.argv[2])
shared = [k for k in small if k in whole]
print(f"models evaluated both ways: {len(shared)}")
# The same models: the last training loss (the loop's, before any test evaluation) must agree exactly.
same = all(small[k]["train_loss"] == whole[k]["train_loss"] for k in shared)
print(f"final training loss identical in every shared run (the same trained models): {same}")
errors = [float(small[k]["test_loss"]) - float(whole[k]["test_loss"]) for k in shared]
print(f"small − whole test loss per model: mean {st.mean(errors):+.4f}, sd {st.stdev(errors):.4f}, "
      f"range [{min(errors):+.4f}, {max(errors):+.4f}]")
arms = sorted({small[k]["label"] for k in shared}, key=lambda l: int(l.split("=")[1]))
print("\n| arm | seeds | sd of test loss, 10 batches | sd, whole split |\n|---|---|---|---|")
for arm in arms:
    ks = [k for k in shared if small[k]["label"] == arm]
    a = [float(small[k]["test_loss"]) for k in ks]
    b = [float(whole[k]["test_loss"]) for k in ks]
    print(f"| {arm} | {len(ks)} | {st.stdev(a):.4f} | {st.stdev(b):.4f} |")
print("\n| paired difference | per-seed, 10 batches | per-seed, whole split | sd, 10 batches | sd, whole split |")
print("|---|---|---|---|---|")
base = arms[0]
for arm in arms[1:]:
    d_small, d_whole = [], []
    for seed in sorted({small[k]["seed"] for k in shared}):
        pair = [k for k in shared if small[k]["seed"] == seed and small[k]["label"] in (base, arm)]
        if len(pair) != 2:
            continue
        v = next(k for k in pair if small[k]["label"] == arm)
        b = next(k for k in pair if small[k]["label"] == base)
        d_small.append(float(small[v]["test_loss"]) - float(small[b]["test_loss"]))
        d_whole.append(float(whole[v]["test_loss"]) - float(whole[b]["test_loss"]))
    fmt = lambda xs: ", ".join(f"{x:+.4f}" for x in xs)
    print(f"| {arm} − {base} | {fmt(d_small)} | {fmt(d_whole)} | {st.stdev(d_small):.4f} | {st.stdev(d_whole):.4f} |")
