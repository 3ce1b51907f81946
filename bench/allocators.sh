#!/usr/bin/env bash
# Times bench/allocators.yaml's complexity points under three allocators, in alternating rounds: glibc's
# defaults, glibc with mmap off (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2000000000) and mimalloc
# (LD_PRELOAD of Debian's libmimalloc2.0). Writes OUT/allocators.csv (round, allocator, variant, pass, n,
# median_ms, peak_mb). Usage: bench/allocators.sh OUT [ROUNDS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$1"
rounds="${2:-2}"
mimalloc=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
[[ -f $mimalloc ]] || { echo "allocators: install Debian's libmimalloc2.0 first" >&2; exit 1; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "round,allocator,variant,pass,n,median_ms,peak_mb" > "$out/allocators.csv"
for ((r = 1; r <= rounds; r++)); do
  for mode in glibc glibc-no-mmap mimalloc; do
    case $mode in
      glibc) env=() ;;
      glibc-no-mmap) env=(MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2000000000) ;;
      mimalloc) env=(LD_PRELOAD="$mimalloc") ;;
    esac
    env "${env[@]}" "$root/target/release/ablate" "$root/bench/allocators.yaml" --device cpu --out "$work/$mode-$r" --quiet
    python3 - "$work/$mode-$r/points.csv" "$r" "$mode" >> "$out/allocators.csv" <<'PY'
import csv, sys
for p in csv.DictReader(open(sys.argv[1])):
    print(",".join([sys.argv[2], sys.argv[3], p["variant"], p["pass"], p["n"], p["median_ms"], p["peak_mb"]]))
PY
  done
done
