#!/usr/bin/env bash
# On the device (carrying .gl and .gpu-pack, packed by `bash tools/gpu-pack.sh conv`):
# forward halo blocks for the v1 model's 16 x 16 convs (32->64 and 64->64)
# that leave room for a second buffer of taps (perf-notes entry 83), whose
# rule block (39.7 KiB) does not: fewer positions, 16 channels a stage, one
# tap a step, or 2 channel tiles a block. `one_buffer` pins the rule block's
# single buffer (its time should match the rule's). About 2 minutes.
bash tools/gpu-sweep.sh 'coop16/conv[34]_b256/(forward|dinput)' <<'CONFIGS'
rule
one_buffer AETHER_HALO_TAP_BUFFERS=1
128x4x3x16x2 AETHER_FORWARD_HALO=128x4x3x16x2
128x4x3x8x2 AETHER_FORWARD_HALO=128x4x3x8x2
256x4x3x16x2x16 AETHER_FORWARD_HALO=256x4x3x16x2x16
256x4x1x16x2 AETHER_FORWARD_HALO=256x4x1x16x2
256x2x3x16x2 AETHER_FORWARD_HALO=256x2x3x16x2
rule_again
CONFIGS
