#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# `bash tools/gpu-sweep.sh FILTER < CONFIGS` runs the criterion conv bench's FILTER
# once per line of CONFIGS ("label VAR=value ..."; a bare label runs the rule)
# and prints one line per config with its times in the bench's order, plus any
# [aether] warning (a pinned block that does not fit says so). The summary goes
# to stdout and $OUT/log.txt, the last bench's whole output to $OUT/bench.txt.
# The gpu-sweep-*.sh scripts hold the configs of each sweep. Before stop 33 the
# bench's dinput also flipped the filter wherever the halo kernel ran, which the
# step does not (docs/lab/perf-notes.md, entry 86): sweeps run before then favour
# the GEMM core on dinput.
filter=$1
source tools/gpu-env.sh
R=${OUT:-/tmp/sweep}; mkdir -p "$R"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
while read -r label env; do
    env $env timeout 60 /tmp/b/conv_bench --bench "$filter" < /dev/null > "$R/bench.txt" 2>&1
    echo "$label rc=$? $(grep -E 'time:' "$R/bench.txt" | grep -v '%' | tr -s ' ' | cut -d' ' -f5,6 | paste -sd'|')"
    grep -m2 '^\[aether\]' "$R/bench.txt"
done
} 2>&1 | tee "$R/log.txt"
