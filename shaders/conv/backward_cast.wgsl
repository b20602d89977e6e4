// conv_backward_cast_fp16: one dispatch writes both fp16 operands of the
// backward pass. Words [0, dvalues_words) are dvalues, clipped to +-65504;
// the words after them are the inputs, cast unclipped (70000 -> inf).

@group(0) @binding(0) var<storage, read> dvalues: array<u32>;
@group(0) @binding(1) var<storage, read> inputs: array<u32>;
@group(0) @binding(2) var<storage, read_write> dvalues_f16: array<u32>;
@group(0) @binding(3) var<storage, read_write> inputs_f16: array<u32>;

struct Params {
    dvalues_len: u32,
    inputs_len: u32,
    row_stride: u32,
}
@group(0) @binding(4) var<uniform> params: Params;

fn word_of_dvalues(word: u32) -> u32 {
    let i = 2u * word;
    let lo = clip_f16_range(dvalues[i]);
    let hi = select(0u, clip_f16_range(dvalues[min(i + 1u, params.dvalues_len - 1u)]), i + 1u < params.dvalues_len);
    return pack_f16_pair(lo, hi);
}

fn word_of_inputs(word: u32) -> u32 {
    let i = 2u * word;
    let hi = select(0u, inputs[min(i + 1u, params.inputs_len - 1u)], i + 1u < params.inputs_len);
    return pack_f16_pair(inputs[i], hi);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let word = gid.x + gid.y * params.row_stride;
    let dvalues_words = (params.dvalues_len + 1u) / 2u;
    let inputs_words = (params.inputs_len + 1u) / 2u;
    if (word < dvalues_words) {
        dvalues_f16[word] = word_of_dvalues(word);
    } else if (word - dvalues_words < inputs_words) {
        inputs_f16[word - dvalues_words] = word_of_inputs(word - dvalues_words);
    }
}
