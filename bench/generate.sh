#!/usr/bin/env bash
# Generation with the KV cache against without it: `ablate bench --generate N` (greedy, one sequence after a
# 16-token prompt, context = prompt + N, random weights) for two model sizes and N = 256 and 1,024, in
# ROUNDS rounds. Writes OUT/generate.csv (round, config, new_tokens, cached_tokens_per_s,
# uncached_tokens_per_s). Usage: bench/generate.sh OUT [ROUNDS]; ABLATE_BIN names another build to time
# (default: target/release/ablate).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$1"
rounds="${2:-3}"
ablate="${ABLATE_BIN:-$root/target/release/ablate}"
mkdir -p "$out"
echo "round,config,new_tokens,cached_tokens_per_s,uncached_tokens_per_s" > "$out/generate.csv"
for ((r = 1; r <= rounds; r++)); do
  for config in "4 4 128" "6 6 384"; do
    read -r layers heads width <<< "$config"
    for n in 256 1024; do
      line="$("$ablate" bench --generate "$n" --layers "$layers" --heads "$heads" --d-model "$width" --device cpu)"
      cached="$(sed -n 's/.* cached: \([0-9.]*\) tokens\/s/\1/p' <<< "$line")"
      uncached="$(sed -n 's/.* uncached: \([0-9.]*\) tokens\/s/\1/p' <<< "$line")"
      echo "$r,${layers}L/${heads}H/d${width},$n,$cached,$uncached" >> "$out/generate.csv"
    done
  done
done
cat "$out/generate.csv"
