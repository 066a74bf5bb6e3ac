#!/usr/bin/env bash
# On the GPU machine, after a build into build-gpu: Nsight Compute's key counters for the CUDA
# template kernels of one timing gtest, one launch a setting (KC_TIMING_ONCE), only the calls whose
# key holds MATCH (KC_TIMING_MATCH), as one CSV row a launch into $OUT/ncu_<NAME>.csv.
#   OUT=... scripts/device_ncu.sh NAME GTEST_FILTER MATCH KERNEL_REGEX
set -uo pipefail
name=$1 filter=$2 match=$3 kern=$4
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
m=gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__block_size
m=$m,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
m=$m,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active
m=$m,lts__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
for s in long_scoreboard lg_throttle mio_throttle short_scoreboard wait not_selected math_pipe_throttle; do
  m=$m,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
KC_TIMING_ONCE=1 KC_TIMING_MATCH="$match" timeout ${NCU_S:-200} ncu --clock-control none -k "regex:$kern" --metrics "$m" \
  --csv --page raw build-gpu/tests/kc_template_gpu_tests --gtest_filter="$filter" > $OUT/ncu_$name.csv 2> $OUT/ncu_$name.err
echo "ncu $name rc=$?: $(grep -c '^"[0-9]' $OUT/ncu_$name.csv) launches"
grep -E " ms " $OUT/ncu_$name.csv | head -20
