#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash .ci/gpu-pack.sh conv`):
# dweight's halo kernel with K tiles stacking 16 images (AETHER_HALO_STACK=1,
# which stacks the forward and dinput too) on the v1 model's last conv
# (8x8x64 -> 128, batch 256): blocks of one output row of 16 images, the
# split over them at 1 to 8 workgroups a unit (perf-notes entry 82). Their
# 48672 bytes of workgroup memory pass only with AETHER_DWEIGHT_HALO pinned
# (the rule allows 32 KiB). About a minute.
bash .ci/gpu-sweep.sh 'coop16/conv5_b256/dweight' <<'CONFIGS'
rule
stack AETHER_HALO_STACK=1 AETHER_DWEIGHT_HALO=64
stack_split1 AETHER_HALO_STACK=1 AETHER_DWEIGHT_HALO=64 AETHER_DWEIGHT_SPLIT=1
stack_split3 AETHER_HALO_STACK=1 AETHER_DWEIGHT_HALO=64 AETHER_DWEIGHT_SPLIT=3
stack_split4 AETHER_HALO_STACK=1 AETHER_DWEIGHT_HALO=64 AETHER_DWEIGHT_SPLIT=4
stack_split8 AETHER_HALO_STACK=1 AETHER_DWEIGHT_HALO=64 AETHER_DWEIGHT_SPLIT=8
rule_again
CONFIGS
