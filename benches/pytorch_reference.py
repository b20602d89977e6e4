#!/usr/bin/env python3
"""PyTorch + cuDNN side of BENCHMARKS.md: the Aether-ML v1 CIFAR-10 model and
its five conv shapes (plus the large 56x56x64->64 bench shape), timed the way
`cargo run --release --example cifar10_breakdown` times aether, printing the
same table layout so one device run puts both side by side.

    python3 benches/pytorch_reference.py [--batch-size 256] [--repeats 30] [--json PATH] [--parts]
    python3 benches/pytorch_reference.py --kernels
    python3 benches/pytorch_reference.py --convs resnet18 [--batch-size 256]

- ms/step: median over --repeats steps, each synchronised on its own, of
  host->device batch copy + forward + loss + backward + AdamW, for fp32 eager,
  AMP fp16 channels_last eager, and the AMP step captured in one CUDA graph;
  and pipelined: --repeats steps back to back, one synchronise at the end.
- Per conv: cuDNN fp16 channels_last forward and backward (dgrad except for the
  first layer, which aether skips too, + wgrad + bias grad): 20 back-to-back
  calls captured in one CUDA graph, CUDA-event time of a replay / 20, median of
  --repeats (the fwd/bwd columns); and the same 20 calls issued eagerly (the
  eager columns), which is the host's time wherever PyTorch's dispatch per
  call outlasts the kernels.
- With --parts, each conv's backward again in two halves, graph-timed the same
  way: wgrad + bias grad, and dgrad alone (not for the first layer), printed
  after the table as `parts` lines (as `examples/conv_passes.rs --parts`
  prints aether's: dweight + its reduce, and dinput).
- With --convs NETWORK (v1, resnet18, airbench94, or resnet50: ImageNet's
  ResNet-50 at 224 px without its stem), only the per-conv table
  for that network's distinct convs (no model step), as
  `examples/conv_passes.rs --convs NETWORK` prints aether's, a conv the
  network runs several times listed once with its count.
- With --kernels, only the CUDA kernels cuDNN runs for each conv's forward,
  wgrad + bias grad and dgrad, with their times from torch.profiler: which
  algorithm cudnn.benchmark picked (an implicit GEMM, Winograd, FFT).
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn

LAYERS = [  # (H, W, C_in, C_out) of the five 3x3 'same' convs
    (32, 32, 3, 32),
    (32, 32, 32, 32),
    (16, 16, 32, 64),
    (16, 16, 64, 64),
    (8, 8, 64, 128),
]
LARGE = (56, 56, 64, 64)


def conv(h, c_in, c_out, kernel=3, stride=1, bias=False, count=1):
    """One conv of a network: (H, W, C_in, C_out, kernel, stride, bias, count),
    'same' padding for 3x3 (one pixel each side), none for 1x1 and 2x2."""
    return (h, h, c_in, c_out, kernel, stride, bias, count)


# The distinct convs of each network, as examples/conv_passes.rs lists them;
# the first of each is the network's first layer (no dgrad).
CONVS = {
    "v1": [conv(h, ci, co, bias=True) for h, _, ci, co in LAYERS],
    "resnet18": [
        conv(32, 3, 64), conv(32, 64, 64, count=4),
        conv(32, 64, 128, stride=2), conv(32, 64, 128, 1, 2),
        conv(16, 128, 128, count=3),
        conv(16, 128, 256, stride=2), conv(16, 128, 256, 1, 2),
        conv(8, 256, 256, count=3),
        conv(8, 256, 512, stride=2), conv(8, 256, 512, 1, 2),
        conv(4, 512, 512, count=3),
    ],
    "airbench94": [
        conv(32, 3, 24, 2, bias=True), conv(31, 24, 64), conv(15, 64, 64),
        conv(15, 64, 256), conv(7, 256, 256), conv(7, 256, 256), conv(3, 256, 256),
    ],
    # torchvision's ResNet-50 at 224 px without its stem: every 1x1 and 3x3
    # conv of its bottleneck stages, projections included (each has a dgrad).
    "resnet50": [
        conv(56, 64, 64, 1), conv(56, 64, 64, count=3), conv(56, 64, 256, 1, count=4),
        conv(56, 256, 64, 1, count=2),
        conv(56, 256, 128, 1), conv(56, 128, 128, stride=2), conv(28, 128, 512, 1, count=4),
        conv(56, 256, 512, 1, 2), conv(28, 512, 128, 1, count=3), conv(28, 128, 128, count=3),
        conv(28, 512, 256, 1), conv(28, 256, 256, stride=2), conv(14, 256, 1024, 1, count=6),
        conv(28, 512, 1024, 1, 2), conv(14, 1024, 256, 1, count=5), conv(14, 256, 256, count=5),
        conv(14, 1024, 512, 1), conv(14, 512, 512, stride=2), conv(7, 512, 2048, 1, count=3),
        conv(14, 1024, 2048, 1, 2), conv(7, 2048, 512, 1, count=2), conv(7, 512, 512, count=2),
    ],
}
# The networks whose list starts with their first layer (timed without dgrad).
LISTS_FIRST_LAYER = {"v1", "resnet18", "airbench94"}


def v1_model():
    layers, c_in = [], 3
    for filters, dropout in [((32, 32), 0.1), ((64, 64), 0.15), ((128,), 0.2)]:
        for f in filters:
            # Keras momentum 0.9 == PyTorch momentum 0.1; eps 1e-5 as in aether.
            layers += [nn.Conv2d(c_in, f, 3, padding=1), nn.BatchNorm2d(f, eps=1e-5, momentum=0.1), nn.ReLU()]
            c_in = f
        layers += [nn.MaxPool2d(2), nn.Dropout2d(dropout)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)]
    return nn.Sequential(*layers)


def batch(n):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def timed_steps(step, repeats, warmup=5):
    """(median ms of synchronised steps, ms per step of `repeats` back to back)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    torch.cuda.synchronize()
    return statistics.median(times), (time.perf_counter() - start) * 1e3 / repeats


def model_step_times(n, repeats):
    x_host, y_host = batch(n)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    results = {}

    def eager(amp):
        model = v1_model().cuda()
        fmt = torch.channels_last if amp else torch.contiguous_format
        model = model.to(memory_format=fmt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        scaler = torch.amp.GradScaler(enabled=amp)

        def step():
            x = x_host.cuda().to(memory_format=fmt)
            y = y_host.cuda()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        return timed_steps(step, repeats)

    results["fp32 eager"] = eager(False)
    results["AMP fp16 channels_last eager"] = eager(True)

    # The whole AMP step in one CUDA graph (PyTorch's documented whole-network
    # capture); the batch copy into the static input stays outside the graph.
    model = v1_model().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, capturable=True)
    static_x = torch.empty(n, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    static_y = torch.empty(n, dtype=torch.long, device="cuda")
    static_x.copy_(x_host)
    static_y.copy_(y_host)

    def amp_step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            amp_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        amp_step()

    def replay():
        static_x.copy_(x_host.cuda(non_blocking=True))
        static_y.copy_(y_host.cuda(non_blocking=True))
        graph.replay()

    results["AMP fp16 channels_last CUDA graph"] = timed_steps(replay, repeats)
    return results


def full(shape):
    """A shape as (H, W, C_in, C_out, kernel, stride, bias, count): the v1
    lists' 4-tuples are 3x3, stride 1, with bias."""
    return shape if len(shape) == 8 else (*shape, 3, 1, True, 1)


def conv_calls(n, shape):
    """The conv's forward, and its backward for an output mask (dgrad, wgrad,
    bias grad): what autograd runs, called directly so that it can be captured
    on a graph's stream."""
    h, w, c_in, c_out, k, stride, bias, _ = full(shape)
    pad = 1 if k == 3 else 0
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=pad, bias=bias)
    conv = conv.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(n, c_in, h, w, device="cuda").half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        dy = torch.randn_like(conv(x))

    def forward():
        with torch.no_grad():
            conv(x)

    def backward(mask):
        with torch.no_grad():
            torch.ops.aten.convolution_backward(
                dy, x, conv.weight, [c_out] if bias else None, [stride, stride], [pad, pad],
                [1, 1], False, [0, 0], 1, mask if bias else mask[:2] + [False])

    return forward, backward


def conv_kernels(n, shape):
    """The CUDA kernels cuDNN runs for the conv's forward, wgrad + bias grad and
    dgrad (after cudnn.benchmark has picked them), with their device times."""
    forward, backward = conv_calls(n, shape)
    passes = {"forward": forward,
              "wgrad+bias": lambda: backward([False, True, True]),
              "dgrad": lambda: backward([True, False, False])}
    rows = []
    for name, fn in passes.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                rows.append((name, event.device_time, event.name))
    return rows


def conv_times(n, shape, first, repeats, parts=False, calls=20):
    h, w, c_in, c_out, k, stride, bias, count = full(shape)
    forward, backward_masked = conv_calls(n, shape)
    mask = [not first, True, True]

    def event_ms(fn):
        # Eager: each call pays PyTorch's host dispatch; where that outlasts
        # the kernels, the GPU idles between calls and the time is the host's.
        for _ in range(3):
            fn()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        return statistics.median(samples)

    def graph_ms(fn):
        # The same calls captured in one CUDA graph: no host work between
        # kernels, so this is cuDNN's own time back to back.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        return statistics.median(samples)

    def backward(mask=mask):
        backward_masked(mask)

    eager = (event_ms(forward), event_ms(backward))
    fwd, bwd = graph_ms(forward), graph_ms(backward)
    halves = {}
    if parts:
        halves["wgrad_ms"] = graph_ms(lambda: backward([False, True, True]))
        halves["dgrad_ms"] = None if first else graph_ms(lambda: backward([True, False, False]))
    pad = 1 if k == 3 else 0
    h_out, w_out = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    m, depth = n * h_out * w_out, k * k * c_in
    fwd_flops = 2 * m * depth * c_out
    bwd_flops = 2 * m * (depth + int(bias)) * c_out + (0 if first else 2 * m * depth * c_out)
    label = f"{h}x{w}x{c_in}->{c_out}" + ("" if (k, stride) == (3, 1) else f":{k}x{k}s{stride}")
    return {
        "shape": f"Conv2d {label}",
        "count": count,
        "forward_ms": fwd,
        "backward_ms": bwd,
        "forward_tflops": fwd_flops / (fwd * 1e-3) / 1e12,
        "backward_tflops": bwd_flops / (bwd * 1e-3) / 1e12,
        "variant": "cudnn fp16 NHWC",
        "eager_forward_ms": eager[0],
        "eager_backward_ms": eager[1],
        **halves,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json")
    parser.add_argument("--parts", action="store_true",
                        help="also time each conv's wgrad + bias grad and its dgrad apart")
    parser.add_argument("--kernels", action="store_true",
                        help="only list the CUDA kernels cuDNN runs for each conv's passes")
    parser.add_argument("--convs", choices=sorted(CONVS),
                        help="only the per-conv table of this network's distinct convs")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    n = args.batch_size
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}")
    if args.convs:
        print(f"{args.convs} convs, batch {n}")
        print(f"{'layer':<5} {'conv':<26} {'fwd ms':>10} {'bwd ms':>10} {'fwd TF/s':>9} {'bwd TF/s':>9} "
              f"{'count':>5}")
        total = 0.0
        for i, shape in enumerate(CONVS[args.convs]):
            c = conv_times(n, shape, i == 0 and args.convs in LISTS_FIRST_LAYER, args.repeats)
            print(f"{i:<5} {c['shape']:<26} {c['forward_ms']:>10.4f} {c['backward_ms']:>10.4f} "
                  f"{c['forward_tflops']:>9.2f} {c['backward_tflops']:>9.2f} {c['count']:>5}")
            total += (c["forward_ms"] + c["backward_ms"]) * c["count"]
        print(f"{'all convs':<32} {total:>10.4f} ms (fwd+bwd)")
        return
    if args.kernels:
        for shape in LAYERS[1:] + [LARGE]:
            label = "Conv2d {}x{}x{}->{}".format(*shape)
            for name, us, kernel in conv_kernels(n, shape):
                print(f"kernels {label:<26} {name:<11} {us:>8.1f} us  {kernel}")
        return
    steps = model_step_times(n, args.repeats)
    for name, (ms, pipelined) in steps.items():
        print(f"v1 CIFAR-10 model, batch {n}, 32x32x3, {name}: {ms:.3f} ms/step "
              f"(median of {args.repeats} synchronised steps), {n / ms * 1e3:.0f} images/s; "
              f"pipelined {pipelined:.3f} ms/step")
    convs = [dict(layer=i, **conv_times(n, s, i == 0, args.repeats, args.parts))
             for i, s in enumerate(LAYERS)]
    large = conv_times(n, LARGE, False, args.repeats)
    print(f"{'layer':<5} {'conv':<26} {'fwd ms':>10} {'bwd ms':>10} {'fwd TF/s':>9} {'bwd TF/s':>9}  "
          f"variant          {'eager fwd':>9} {'eager bwd':>9}")
    for c in convs + [dict(layer="large", **large)]:
        print(f"{c['layer']:<5} {c['shape']:<26} {c['forward_ms']:>10.4f} {c['backward_ms']:>10.4f} "
              f"{c['forward_tflops']:>9.2f} {c['backward_tflops']:>9.2f}  {c['variant']:<16} "
              f"{c['eager_forward_ms']:>9.4f} {c['eager_backward_ms']:>9.4f}")
    total = sum(c["forward_ms"] + c["backward_ms"] for c in convs)
    print(f"{'all convs':<32} {total:>10.4f} ms (fwd+bwd)")
    if args.parts:
        # `parts` first, so tools/conv-verdict.awk (which matches `Conv2d` as the
        # second field) leaves these lines alone.
        print(f"parts {'layer':<5} {'conv':<26} {'wgrad+bias ms':>13} {'dgrad ms':>10}")
        for c in convs:
            dgrad = "-" if c["dgrad_ms"] is None else f"{c['dgrad_ms']:.4f}"
            print(f"parts {c['layer']:<5} {c['shape']:<26} {c['wgrad_ms']:>13.4f} {dgrad:>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "batch": n, "repeats": args.repeats,
                       "ms_per_step": steps, "convs": convs, "large": large}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
