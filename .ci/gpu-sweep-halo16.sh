#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash .ci/gpu-pack.sh conv`):
# the halo kernel's blocks on the v1 model's 16 x 16 convs (32->64 and 64->64),
# whose forwards sit at cuDNN's times (run N5: 0.0266 against 0.0270 and 0.0378
# against 0.0327 ms on an H100). Their 256 blocks of a whole image each give
# every workgroup one block of 6 steps; smaller blocks taking turns (entry 61)
# or more workgroups a unit were not tried on them. About 3 minutes.
source .ci/gpu-env.sh
R=${OUT:-/tmp/sweep}; mkdir -p "$R"
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
while read -r label env; do
    env $env timeout 60 /tmp/b/conv_bench --bench 'coop16/conv[34]_b256/(forward|dinput)' \
        < /dev/null > "$R/h.txt" 2>&1
    echo "$label rc=$? $(grep -E 'time:' "$R/h.txt" | grep -v '%' | tr -s ' ' | cut -d' ' -f5,6 | paste -sd'|')"
    grep -m2 '^\[aether\]' "$R/h.txt"   # a pinned block that does not fit says so here
done <<'CONFIGS'
rule
groups1 AETHER_HALO_GROUPS=1
groups4 AETHER_HALO_GROUPS=4
per_block AETHER_HALO_GROUPS=0
128x4_8x2 AETHER_FORWARD_HALO=128x4x3x16x2
128x4_8x2_g1 AETHER_FORWARD_HALO=128x4x3x16x2 AETHER_HALO_GROUPS=1
128x4_8x2_g4 AETHER_FORWARD_HALO=128x4x3x16x2 AETHER_HALO_GROUPS=4
128x4_4x4 AETHER_FORWARD_HALO=128x4x3x16x4
128x4_4x2 AETHER_FORWARD_HALO=128x4x3x8x2
256x2_8x2 AETHER_FORWARD_HALO=256x2x3x16x2
256x4_16x2 AETHER_FORWARD_HALO=256x4x3x32x2
256x4_8x4 AETHER_FORWARD_HALO=256x4x3x32x4
rule_again
CONFIGS
} 2>&1 | tee "$R/log.txt"
