# Sourced on the device machine (carrying .gl and .gpu-pack): installs the
# Vulkan loader from .gl, unpacks the binaries of tools/gpu-pack.sh into /tmp/b
# and points wgpu at the NVIDIA driver.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
mkdir -p /tmp/b && tar -C /tmp/b -xzf .gpu-pack/bins.tgz
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export XDG_RUNTIME_DIR=/tmp AETHER_CACHE_DIR=/tmp/aether-cache
