#!/usr/bin/env bash
# Builds the release binaries the device machine runs (it has no Rust
# toolchain) and packs them into the git-ignored .gpu-pack/bins.tgz:
# examples, the criterion conv bench and every test binary.
# Run on the device (carrying .gl and .gpu-pack) with .ci/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-bin .gpu-pack && mkdir -p .gpu-bin/tests .gpu-pack
cargo build --release --examples --benches
cp target/release/examples/{cifar10,cifar10_breakdown} .gpu-bin/
bench=$(cargo bench --no-run --bench conv 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
cp "$bench" .gpu-bin/conv_bench
cargo test --release --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' \
    | grep '/deps/' | xargs cp -t .gpu-bin/tests
strip .gpu-bin/tests/* .gpu-bin/{cifar10,cifar10_breakdown,conv_bench}
tar -C .gpu-bin -czf .gpu-pack/bins.tgz .
ls -la .gpu-pack
