#!/usr/bin/env bash
# The per-call overhead of two builds of the library, interleaved (in alternating order) so that
# machine drift hits both:
#   benchmarks/compare_overhead.sh OLD_BUILD NEW_BUILD [cpu|cuda] [ROUNDS]
# Prints "<which> <mode> <ns per call>" lines (relu, 1,024 floats; benchmarks/overhead.cpp), then
# the median of each. Hand-stored kernels are served for the hit mode (KERNELCRAFT_SERVE_UNVERIFIED).
# Evolution is off (KERNELCRAFT_EVOLVE=0): a miss would otherwise start a worker whose search
# competes for the CPU with the calls being timed, in one build and not in one built without the CLI.
set -uo pipefail
OLD=${1:?old build dir}; NEW=${2:?new build dir}; DEV=${3:-cpu}; ROUNDS=${4:-5}
out=$(mktemp)
for r in $(seq "$ROUNDS"); do
  order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"   # alternate, so neither always runs first
  for which in $order; do
    B=$OLD; [ "$which" = new ] && B=$NEW
    for mode in miss hit; do
      ns=$(KERNELCRAFT_EVOLVE=0 KERNELCRAFT_SERVE_UNVERIFIED=1 KERNELCRAFT_CACHE_DIR=$(mktemp -d) "$B/benchmarks/kc_overhead" --device "$DEV" \
             --n 1024 --lib "$B/torch_ops/libkernelcraft.so" --mode "$mode" 2>/dev/null | grep -o '"ns_per_call":[0-9.]*' | cut -d: -f2)
      echo "$which $mode $ns" | tee -a "$out"
    done
  done
  ns=$("$NEW/benchmarks/kc_overhead" --device "$DEV" --n 1024 | grep -o '"ns_per_call":[0-9.]*' | cut -d: -f2)
  echo "no_library - $ns" | tee -a "$out"
done
echo "medians:"
sort -k1,2 "$out" | awk '{k=$1" "$2; v[k]=v[k]" "$3; n[k]++} END {for (k in v) {split(v[k], a, " "); m=n[k];
  for (i=1;i<=m;i++) for (j=i+1;j<=m;j++) if (a[j]+0 < a[i]+0) {t=a[i]; a[i]=a[j]; a[j]=t}
  print "  " k ": " a[int((m+1)/2)] " ns"}}' | sort
rm -f "$out"
