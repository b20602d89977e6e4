pin() { echo "AETHER_HALO_STACK=1 AETHER_FORWARD_HALO=$1"; }
bash .ci/gpu-sweep.sh 'coop16/conv5_b256/(forward|dweight|dinput)' <<CONFIGS
rule
s16x4x3x16x2 $(pin 16x4x3x16x2x16)
s16x2x3x16x2 $(pin 16x2x3x16x2x16)
s16x2x3x16x1 $(pin 16x2x3x16x1x16)
s16x2x3x8x2 $(pin 16x2x3x8x2x16)
s16x2x9x16x2 $(pin 16x2x9x16x2x16)
s16x2x9x8x2 $(pin 16x2x9x8x2x16)
s8x2x3x16x2 $(pin 8x2x3x16x2x16)
s16x2x1x16x2 $(pin 16x2x1x16x2x16)
rule_again
CONFIGS
