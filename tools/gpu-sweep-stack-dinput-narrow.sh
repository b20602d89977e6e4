#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# stacked halo blocks of 32 or 16 channels on the dinput of the v1 model's last
# conv (8x8x64 -> 128, batch 256: a transposed conv of 128 input channels to 64).
# Perf-notes entry 85: blocks of all 64 channels make 64 workgroups (two rows of
# 16 images) and lose to the GEMM core; blocks of 32 channels make 128 (16: 256),
# each staging 1.5x the forward's bytes, where the core stages 2.9x. About 3 minutes.
pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash tools/gpu-sweep.sh 'coop16/conv5_b256/dinput' <<CONFIGS
core
c32_16sg $(pin 16x2x3x16x2x16)
c32_8sg_2col $(pin 16x2x3x8x2x16)
c32_8sg $(pin 16x2x3x8x1x16)
c32_4sg $(pin 16x2x3x4x1x16)
c32_16sg_9taps $(pin 16x2x9x16x2x16)
c32_8sg_9taps $(pin 16x2x9x8x1x16)
c16_8sg $(pin 16x1x3x8x1x16)
c16_16sg $(pin 16x1x3x16x1x16)
c16_8sg_9taps $(pin 16x1x9x8x1x16)
core_again
CONFIGS
