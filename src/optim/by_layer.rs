//! The optimizer's state split by layer, so it outlives a change of which
//! layers train ([`crate::Model::set_trainable`]): the optimizer packs the
//! trained parameters alone, so freezing or thawing a layer lays them out
//! afresh, and each layer's moments (and lookahead average) go where its
//! parameters go. A frozen layer's state waits here until it trains again,
//! as PyTorch keeps a parameter's state while it gets no gradient.

use std::collections::BTreeMap;

use super::OptimizerState;

/// One layer's share: per state buffer, per parameter; and its lookahead
/// average per parameter where one is kept.
#[derive(Clone, Debug, Default, PartialEq)]
struct LayerShare {
    buffers: Vec<Vec<Vec<f32>>>,
    lookahead: Option<Vec<Vec<f32>>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StateByLayer {
    steps: u32,
    names: Vec<String>,
    layers: BTreeMap<usize, LayerShare>,
}

impl StateByLayer {
    /// Splits `state` (and the lookahead average, per parameter), laid out
    /// over the layers with `counts[i]` parameters each in order, into
    /// layers; the shares already held for other layers stay.
    pub fn take(
        &mut self,
        state: OptimizerState,
        lookahead: Option<Vec<Vec<f32>>>,
        counts: &[usize],
    ) {
        self.steps = state.steps;
        self.names = state.buffers.iter().map(|(n, _)| n.clone()).collect();
        let mut buffers: Vec<_> = state
            .buffers
            .into_iter()
            .map(|(_, b)| b.into_iter())
            .collect();
        let mut lookahead = lookahead.map(Vec::into_iter);
        for (layer, &count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            let share = LayerShare {
                buffers: buffers
                    .iter_mut()
                    .map(|b| b.by_ref().take(count).collect())
                    .collect(),
                lookahead: lookahead.as_mut().map(|a| a.by_ref().take(count).collect()),
            };
            self.layers.insert(layer, share);
        }
    }

    /// The optimizer's state for the layers with `counts[i]` parameters each,
    /// in order, with their lookahead averages: each layer's own share
    /// (taken out of this), or empty vectors (the parameter starts afresh)
    /// for a layer with none or a share of other sizes.
    pub fn give(&mut self, counts: &[usize]) -> (OptimizerState, Vec<Vec<f32>>) {
        let mut buffers = vec![Vec::new(); self.names.len()];
        let mut lookahead = Vec::new();
        for (layer, &count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            let share = self
                .layers
                .remove(&layer)
                .filter(|s| s.buffers.iter().all(|b| b.len() == count));
            for (k, buffer) in buffers.iter_mut().enumerate() {
                match share.as_ref().and_then(|s| s.buffers.get(k)) {
                    Some(values) => buffer.extend(values.iter().cloned()),
                    None => buffer.extend(std::iter::repeat_n(Vec::new(), count)),
                }
            }
            match share.and_then(|s| s.lookahead) {
                Some(average) if average.len() == count => lookahead.extend(average),
                _ => lookahead.extend(std::iter::repeat_n(Vec::new(), count)),
            }
        }
        let state = OptimizerState {
            steps: self.steps,
            buffers: self.names.iter().cloned().zip(buffers).collect(),
        };
        (state, lookahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(steps: u32, per_param: &[&[f32]]) -> OptimizerState {
        let m: Vec<Vec<f32>> = per_param.iter().map(|v| v.to_vec()).collect();
        let v = m
            .iter()
            .map(|p| p.iter().map(|x| x * x).collect())
            .collect();
        OptimizerState {
            steps,
            buffers: vec![("m".into(), m), ("v".into(), v)],
        }
    }

    #[test]
    fn a_layer_frozen_and_thawed_gets_its_own_state_back() {
        // Layers 0 (two parameters), 1 (none), 2 (one): all trained.
        let mut by_layer = StateByLayer::default();
        let average = vec![vec![9.0, 8.0], vec![7.0], vec![6.0, 5.0, 4.0]];
        by_layer.take(
            state(7, &[&[1.0, 2.0], &[3.0], &[4.0, 5.0, 6.0]]),
            Some(average),
            &[2, 0, 1],
        );
        // Layer 0 frozen: layer 2 alone is laid out, with its state.
        let (given, lookahead) = by_layer.give(&[0, 0, 1]);
        assert_eq!(given, state(7, &[&[4.0, 5.0, 6.0]]));
        assert_eq!(lookahead, [vec![6.0, 5.0, 4.0]]);
        // Two steps on, layer 0 thaws: its parked state comes back, layer
        // 2's is the optimizer's newer one.
        by_layer.take(state(9, &[&[-4.0, -5.0, -6.0]]), None, &[0, 0, 1]);
        let (given, lookahead) = by_layer.give(&[2, 0, 1]);
        assert_eq!(given, state(9, &[&[1.0, 2.0], &[3.0], &[-4.0, -5.0, -6.0]]));
        // No average was kept since: the thawed layer's own, the other's
        // starts from the weights.
        assert_eq!(lookahead, [vec![9.0, 8.0], vec![7.0], vec![]]);
        assert_eq!(by_layer.layers.len(), 0, "every share was given out");
    }

    #[test]
    fn a_layer_with_no_share_starts_afresh() {
        let mut by_layer = StateByLayer::default();
        by_layer.take(state(3, &[&[1.0]]), None, &[0, 1]);
        let (given, lookahead) = by_layer.give(&[2, 1]);
        assert_eq!(
            given.buffers[0].1,
            [vec![], vec![], vec![1.0]],
            "layer 0 never trained"
        );
        assert_eq!(given.buffers[1].1, [vec![], vec![], vec![1.0]]);
        assert_eq!(lookahead, [Vec::<f32>::new(), vec![], vec![]]);
    }
}
