#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# stacked halo blocks of 32 subgroups on the dinput of the v1 model's last conv
# (8x8x64 -> 128, batch 256: a transposed conv of 128 input channels to 64).
# Perf-notes entry 84: its two-row blocks make only 64 workgroups, so each would
# have to do twice the forward's work per compute unit; 32 subgroups give it twice
# the warps. Run I8 (entry 85): 32 subgroups lost to 16, and the core won; the
# 9-tap and 8-position pins do not fit (they warn now). About 2 minutes.
pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash tools/gpu-sweep.sh 'coop16/conv5_b256/dinput' <<CONFIGS
core
r2_16sg $(pin 16x4x3x16x2x16)
r2_32sg $(pin 16x4x3x32x2x16)
r2_32sg_9taps $(pin 16x4x9x32x2x16)
r2_32sg_4cols $(pin 16x4x3x32x4x16)
r2_32sg_1buf $(pin 16x4x3x32x2x16) AETHER_HALO_TAP_BUFFERS=1
r1_32sg $(pin 8x4x3x32x2x16)
r1_32sg_9taps $(pin 8x4x9x32x2x16)
core_again
CONFIGS
