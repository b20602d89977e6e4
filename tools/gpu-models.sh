#!/usr/bin/env bash
# One device run for issue 36's networks and issue 38's last row: one-image
# predict latency, aether's and PyTorch's training steps for v1, resnet18 and
# airbench94 on the same card, then every distinct conv of resnet18 and
# airbench94 beside cuDNN's. Carry .gl and .gpu-pack holding release builds of
# examples/predict_latency, examples/cifar10_breakdown and examples/conv_passes:
#   cargo build --release --example predict_latency --example cifar10_breakdown --example conv_passes
#   mkdir -p .gpu-pack && cp target/release/examples/{predict_latency,cifar10_breakdown,conv_passes} .gpu-pack/
# then on the device: bash tools/gpu-models.sh (results under $OUT).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p $XDG_RUNTIME_DIR; chmod 700 $XDG_RUNTIME_DIR
export AETHER_CACHE_DIR=/tmp/aether-cache
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
P=.gpu-pack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
{
  AETHER_DEVICE=gpu $P/predict_latency 300
  AETHER_DEVICE=gpu $P/predict_latency 300   # the second launch loads the pipeline cache
  $P/cifar10_breakdown --model v1 --batch-size 256 --repeats 30 --device gpu
  $P/cifar10_breakdown --model resnet18 --batch-size 256 --repeats 30 --device gpu
  $P/cifar10_breakdown --model airbench94 --batch-size 1024 --repeats 20 --device gpu
} > "$OUT/aether.txt" 2>&1
{
  python3 benches/pytorch_models.py --model v1 --batch-size 256
  python3 benches/pytorch_models.py --model resnet18 --batch-size 256
  python3 benches/pytorch_models.py --model airbench94 --batch-size 1024
} > "$OUT/pytorch.txt" 2>&1
{
  $P/conv_passes --convs resnet18 --batch-size 256 --repeats 20
  $P/conv_passes --convs airbench94 --batch-size 1024 --repeats 20
} > "$OUT/aether-convs.txt" 2>&1
{
  python3 benches/pytorch_reference.py --convs resnet18 --batch-size 256 --repeats 20
  python3 benches/pytorch_reference.py --convs airbench94 --batch-size 1024 --repeats 20
} > "$OUT/pytorch-convs.txt" 2>&1
cat "$OUT/gpu.txt"
grep -h "CIFAR-10 model\|pytorch \|median\|first\|resident\|compile" "$OUT/aether.txt" "$OUT/pytorch.txt"
