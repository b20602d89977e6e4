mod common;
use aether::conv::Padding;
use aether::model::{Loss, Metric};
use aether::nn::*;
use aether::optim::Adam;
use aether::{Device, Graph, Model, NodeId};
use common::Rng;
use common::noop::{all_features, full_limits, noop_context};
use std::sync::Arc;

fn cbr(g: &mut Graph, x: NodeId, f: usize, k: usize, s: usize, relu: bool) -> NodeId {
    let pad = if k == 1 {
        Padding::Valid
    } else {
        Padding::Same
    };
    let c = g.add(Conv2d::new(f, (k, k), pad).stride((s, s)).bias(false), &[x]);
    let b = g.add(BatchNorm::new(0.9, 1e-5), &[c]);
    if relu {
        g.add(ReLU::default(), &[b])
    } else {
        b
    }
}

fn resnet50ish(blocks: [usize; 4]) -> Model {
    let mut g = Graph::new();
    let x = g.input();
    let mut h = cbr(&mut g, x, 64, 7, 2, true);
    h = g.add(MaxPool2d::new((3, 3), (2, 2), Padding::Same), &[h]);
    let mut cin = 64;
    for (stage, (&n, width)) in blocks.iter().zip([64, 128, 256, 512]).enumerate() {
        for b in 0..n {
            let s = if b == 0 && stage > 0 { 2 } else { 1 };
            let a = cbr(&mut g, h, width, 1, 1, true);
            let a = cbr(&mut g, a, width, 3, s, true);
            let a = cbr(&mut g, a, width * 4, 1, 1, false);
            let short = if b == 0 {
                cbr(&mut g, h, width * 4, 1, s, false)
            } else {
                h
            };
            let sum = g.add(Add::default(), &[a, short]);
            h = g.add(ReLU::default(), &[sum]);
            cin = width * 4;
        }
    }
    let _ = cin;
    let h = g.add(GlobalAvgPool::default(), &[h]);
    let h = g.add(Flatten::default(), &[h]);
    g.add(Dense::new(1000), &[h]);
    let mut m = Model::from_graph(g).seed(1);
    m.configure(
        Loss::SoftmaxCrossEntropy {
            label_smoothing: 0.1,
        },
        Adam::adamw(1e-3, 0.05),
        Metric::CategoricalAccuracy,
    );
    m
}

#[test]
fn scratch() {
    let ctx = noop_context(all_features(), full_limits());
    let device = Device::Gpu(Arc::clone(&ctx));
    let mut model = resnet50ish([3, 4, 6, 3]);
    model.to(&device).unwrap();
    let input = [224, 224, 3];
    model.finalize(&input).unwrap();
    let batch = 16;
    let t = std::time::Instant::now();
    model.plan_convs(batch, true).unwrap();
    eprintln!("planned in {:?}", t.elapsed());
    let mut rng = Rng::fresh();
    let x = rng.vec(batch * input.iter().product::<usize>());
    let y: Vec<u32> = (0..batch as u32).map(|i| i * 7 % 1000).collect();
    model.train_batch(&x, &y).unwrap();
    model.predict(&x, batch, false).unwrap();
    eprintln!("done in {:?}", t.elapsed());
}
