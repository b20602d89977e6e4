//! Graph models: layers connected by their inputs (a DAG), so a network can
//! have skip connections (ResNet's residual `Add`) and branches (`Concat`).
//!
//! ```
//! use aether::nn::{Add, BatchNorm, Conv2d, Flatten, Dense, GlobalAvgPool, ReLU};
//! use aether::conv::Padding;
//! use aether::{Graph, Model};
//!
//! let mut g = Graph::new();
//! let x = g.input();
//! let stem = g.add(Conv2d::new(8, (3, 3), Padding::Same), &[x]);
//! let a = g.add(BatchNorm::new(0.9, 1e-5), &[stem]);
//! let a = g.add(ReLU::default(), &[a]);
//! let a = g.add(Conv2d::new(8, (3, 3), Padding::Same), &[a]);
//! let sum = g.add(Add::default(), &[a, stem]); // the skip connection
//! let pooled = g.add(GlobalAvgPool::default(), &[sum]);
//! let flat = g.add(Flatten::default(), &[pooled]);
//! g.add(Dense::new(10), &[flat]); // the last layer added is the output
//! let mut model = Model::from_graph(g);
//! model.finalize(&[8, 8, 3]).unwrap();
//! ```
//!
//! Layers run in the order they were added (each after its inputs), and the
//! backward in reverse; where a tensor feeds several layers its gradients are
//! summed. [`crate::Model::add`] is the special case of a plain stack, each
//! layer taking the one before.

use serde::{Deserialize, Serialize};

use crate::error::{AetherError, Result};
use crate::nn::Layer;

/// A tensor of a graph: the model's input, or the output of the layer at an
/// index (in the order layers were added).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeId {
    Input,
    Layer(usize),
}

/// A graph model under construction; [`crate::Model::from_graph`] makes it a
/// model whose output is the last layer added.
#[derive(Default)]
pub struct Graph {
    pub(crate) layers: Vec<Box<dyn Layer>>,
    pub(crate) inputs: Vec<Vec<NodeId>>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    /// The model's input.
    pub fn input(&self) -> NodeId {
        NodeId::Input
    }

    /// Adds `layer` taking `inputs` (one for most layers, two or more for
    /// `Add` and `Concat`); returns its output. Inputs are checked when the
    /// model is finalized, with errors naming the layer.
    pub fn add(&mut self, layer: impl Layer + 'static, inputs: &[NodeId]) -> NodeId {
        self.layers.push(Box::new(layer));
        self.inputs.push(inputs.to_vec());
        NodeId::Layer(self.layers.len() - 1)
    }
}

/// The inputs of layer `index` in a plain stack: the layer before, or the
/// model's input for the first.
pub(crate) fn stacked(index: usize) -> Vec<NodeId> {
    vec![match index {
        0 => NodeId::Input,
        i => NodeId::Layer(i - 1),
    }]
}

/// Whether `inputs` describe a plain stack.
pub(crate) fn is_stack(inputs: &[Vec<NodeId>]) -> bool {
    inputs.iter().enumerate().all(|(i, s)| *s == stacked(i))
}

/// Checks that `inputs` (one list per layer, named by `kinds`) form a DAG in
/// the layers' order whose every layer but the last feeds another; returns
/// each layer's consumers (with multiplicity, in order) and the input's.
pub(crate) fn consumers(
    inputs: &[Vec<NodeId>],
    kinds: &[&'static str],
) -> Result<(Vec<Vec<usize>>, Vec<usize>)> {
    let n = inputs.len();
    let err = |i: usize, reason: String| {
        AetherError::Model(format!("graph layer {i} ({}): {reason}", kinds[i]))
    };
    let mut consumers = vec![Vec::new(); n];
    let mut of_input = Vec::new();
    for (i, sources) in inputs.iter().enumerate() {
        if sources.is_empty() {
            return Err(err(i, "has no inputs".into()));
        }
        for &source in sources {
            match source {
                NodeId::Input => of_input.push(i),
                NodeId::Layer(j) if j < i => consumers[j].push(i),
                NodeId::Layer(j) if j < n => {
                    return Err(err(
                        i,
                        format!(
                            "takes the output of layer {j} ({}), which does not come before it \
                             (a cycle, or a layer added before its input)",
                            kinds[j]
                        ),
                    ));
                }
                NodeId::Layer(j) => {
                    return Err(err(
                        i,
                        format!("takes the output of layer {j}, which does not exist ({n} layers)"),
                    ));
                }
            }
        }
    }
    if let Some(j) = (0..n.saturating_sub(1)).find(|&j| consumers[j].is_empty()) {
        return Err(err(
            j,
            "its output is never used: every layer but the last (the model's output) must \
             feed another"
                .into(),
        ));
    }
    Ok((consumers, of_input))
}
