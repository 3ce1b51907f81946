#!/usr/bin/env bash
# recipes/heads.yaml end to end against the researcher's alternative: the same 15 runs (heads 1, 2, 4, 8, 16 ×
# seeds 0, 1, 2; same model, data, schedule, steps and evaluations) as a loop of a PyTorch eager script
# (bench/eager_lm_run.py, one process per run, torch's default threads), then `ablate recipes/heads.yaml
# --workers auto`. Writes OUT/end_to_end.csv (tool, wall_ms) and OUT/eager_runs.txt. Usage:
# bench/heads_end_to_end.sh OUT [STEPS]   (STEPS: train.steps of every run on both sides, default 1500)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$1"
steps="${2:-1500}"
source "$root/bin/bootstrap.sh"
ablate_setup_torch
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s%N)
: > "$out/eager_runs.txt"
for heads in 1 2 4 8 16; do
  for seed in 0 1 2; do
    PYTHONPATH="$ABLATE_TORCH_PYTHONPATH" python3 -W ignore "$root/bench/eager_lm_run.py" --heads "$heads" --seed "$seed" \
      --steps "$steps" 2>/dev/null | tee -a "$out/eager_runs.txt"
  done
done
eager=$(( ($(date +%s%N) - start) / 1000000 ))
start=$(date +%s%N)
"$root/target/release/ablate" "$root/recipes/heads.yaml" train.steps="$steps" --workers auto --device cpu \
  --out "$work/heads" 2> "$work/ablate.log"
ablate=$(( ($(date +%s%N) - start) / 1000000 ))
grep -E -- "--workers auto" "$work/ablate.log" > "$out/workers_auto.txt" || true
cp "$work/heads/runs.csv" "$out/ablate_runs.csv"
{ echo "tool,wall_ms"; echo "pytorch_eager_loop,$eager"; echo "ablate_workers_auto,$ablate"; } > "$out/end_to_end.csv"
cat "$out/end_to_end.csv"
