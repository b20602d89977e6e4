#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by
# `bash tools/gpu-pack.sh conv conv_pinned_blocks`): issue 7's checks in one
# call, about 3 minutes on an H100: the v1 step's breakdown, PyTorch + cuDNN on
# the same machine (benches/pytorch_reference.py) with each conv pass set
# against cuDNN's (tools/conv-verdict.awk) and the kernels cuDNN ran, in the step and back to back
# (examples/conv_passes.rs), the large shape's and the 4096^3 GEMM's criterion
# benches (the GEMM also with the blocks it had before docs/lab/perf-notes.md entry
# 62), the conv suite, the sweeps' pinned blocks and the v1 shapes' benches. A
# summary goes to stdout and $OUT/log.txt, each tool's whole output under $OUT.
source tools/gpu-env.sh
R=${OUT:-/tmp/sweep}; mkdir -p "$R"
conv_test=$(ls /tmp/b/tests/conv-*)
summary() { grep -E '^coop16|time:|thrpt:' "$1" | grep -v '%' | tr -s ' ' | paste -sd' ' | sed 's/coop16/\ncoop16/g'; }
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# Most wanted first, should the machine be taken back: the step against PyTorch.
# A short run first fills the pipeline cache: the second one's first step is the
# warm-cache start (docs/lab/perf-notes.md, entry 63).
timeout 90 /tmp/b/cifar10_breakdown --repeats 5 > "$R/bd_cold.txt" 2>&1
echo "cold cache: rc=$? $(grep 'first step' "$R/bd_cold.txt")"
timeout 90 /tmp/b/cifar10_breakdown --repeats 50 > "$R/bd.txt" 2>&1
echo "breakdown: rc=$?"; grep -vE "^\[aether\]|^ *$" "$R/bd.txt" | head -14
timeout 200 python3 benches/pytorch_reference.py --repeats 30 --parts > "$R/pt.txt" 2>&1
echo "pytorch: rc=$?"; grep -v '^parts' "$R/pt.txt" | tail -10; grep '^parts' "$R/pt.txt"
awk -f tools/conv-verdict.awk "$R/bd.txt" "$R/pt.txt"
# Which kernels cuDNN ran (docs/lab/perf-notes.md, entry 85): its algorithm choice
# can change with the driver or the cuDNN version.
timeout 60 python3 benches/pytorch_reference.py --kernels > "$R/kernels.txt" 2>&1
echo "cudnn kernels: rc=$?"; grep '^kernels' "$R/kernels.txt" | grep -v -e Memset -e elementwise -e reduce_kernel \
    | awk '{k = ($7 == "void") ? $8 : $7
            if (k ~ /Kernel</) { sub(/.*Kernel</, "", k); sub(/>.*/, "", k) }
            else sub(/_kernel__5x_cudnn.*|<.*|\(.*/, "", k)
            print $3, $4, $5, "us", k}'
# The same verdict with aether's passes timed as the reference times cuDNN's:
# 20 calls back to back in one compute pass (examples/conv_passes.rs), with
# each backward's two halves beside cuDNN's (the `parts` lines).
timeout 120 /tmp/b/conv_passes --repeats 30 --parts > "$R/passes.txt" 2>&1
echo "back-to-back passes: rc=$?"; grep -v '^parts' "$R/passes.txt" | tail -6; grep '^parts' "$R/passes.txt"
awk -f tools/conv-verdict.awk "$R/passes.txt" "$R/pt.txt" | sed 's/^/back to back: /'
timeout 60 /tmp/b/conv_bench --bench 'coop16/large' < /dev/null > "$R/large.txt" 2>&1
echo "large shape: rc=$?"; summary "$R/large.txt"
while read -r label env; do
    env $env timeout 60 /tmp/b/conv_bench --bench 'coop16/gemm4096' < /dev/null > "$R/g_$label.txt" 2>&1
    echo "4096^3 $label rc=$? $(grep -E 'thrpt:' "$R/g_$label.txt" | grep -v '%' | head -3 | tr -s ' ' | cut -d' ' -f5,6 | paste -sd'|')"
done <<'CONFIGS'
rule
before_entry_62 AETHER_COOP_BLOCK=forward=4x2x4x4x2,dinput=4x2x4x4x2,dweight=2x2x4x4x2
CONFIGS
timeout 120 "$conv_test" --test-threads=1 > "$R/t.txt" 2>&1
echo "conv suite: rc=$? $(grep 'test result' "$R/t.txt")"
grep -E "panicked|^---- |\[aether\]" -A1 "$R/t.txt" | head -20
# The sweeps' pinned blocks (packed with `gpu-pack.sh conv conv_pinned_blocks`).
for t in /tmp/b/tests/conv_pinned_blocks-*; do
    [ -e "$t" ] || continue
    timeout 60 "$t" > "$R/pins.txt" 2>&1
    echo "pinned blocks: rc=$? $(grep 'test result' "$R/pins.txt")"
    grep -E "panicked" -A1 "$R/pins.txt" | head -4
done
timeout 80 /tmp/b/conv_bench --bench 'coop16/conv' < /dev/null > "$R/v1.txt" 2>&1
echo "v1 shapes: rc=$?"; summary "$R/v1.txt"
} 2>&1 | tee "$R/log.txt"
