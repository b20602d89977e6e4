#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# stacked halo blocks on the dinput of the v1 model's last conv (8x8x64 -> 128,
# batch 256: a transposed conv of 128 input channels to 64), which runs the
# GEMM core (`Narrow::Decline`), swept again with naga's index clamping left out
# and two tap buffers where they fit (perf-notes entry 83). Run O7 had these
# blocks at 35.71-42.87 us against the core's 33.6-33.9. One row of 8 positions
# of 16 images by all 64 channels: 128 workgroups. About 1 minute.
pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash tools/gpu-sweep.sh 'coop16/conv5_b256/dinput' <<CONFIGS
core
8x4x3x16x2 $(pin 8x4x3x16x2x16)
8x4x3x16x2_one_buffer $(pin 8x4x3x16x2x16) AETHER_HALO_TAP_BUFFERS=1
8x4x3x8x2 $(pin 8x4x3x8x2x16)
8x4x9x16x2 $(pin 8x4x9x16x2x16)
8x4x9x8x2 $(pin 8x4x9x8x2x16)
8x4x3x16x4 $(pin 8x4x3x16x4x16)
8x4x1x16x2 $(pin 8x4x1x16x2x16)
core_again
CONFIGS
