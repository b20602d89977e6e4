//! The ceilings the conv kernels work under: how many f16 x f16 -> f32
//! cooperative-matrix multiply-adds a second this adapter runs through wgpu,
//! with nothing else in the loop, then with the conv kernels' staging.
//!
//!     cargo run --release --example coop_peak -- [--rounds 2048] [--repeats 5] [--workgroups 1056] [--operands "global direct"]
//!
//! Each subgroup holds TM x TN accumulator tiles and runs `--rounds` rounds of
//! multiply-adds on them, its operand tiles taken (see `Operands`)
//! - from registers, loaded once before the loop: the matrix units alone;
//! - from workgroup memory every round, in the conv kernels' layout and in
//!   others: the inner loop of a kernel, without its barriers and global loads;
//! - from the GEMM core's staged step: runs written to workgroup memory, two
//!   barriers, and the runs fetched from global memory or made up in registers.
//!
//! Each line is the best of `--repeats` timed dispatches (timestamp queries
//! around one compute pass, `GpuContext::timed_span`) after one untimed; the
//! kernels compile through the context's pipeline cache. The table's TFLOP/s set the conv
//! passes' own (`conv_passes`) against what each layer of the kernels allows
//! (docs/lab/perf-notes.md, entry 81).

#[path = "shared/xdg.rs"]
mod xdg;

use std::time::Instant;

use aether::gpu::{GpuContext, GpuOptions, GpuSlice, PipelineKey};
use aether::{AetherError, Result};

const USAGE: &str =
    "usage: coop_peak [--rounds N] [--repeats N] [--workgroups N] [--operands PREFIX]";
/// Workgroups a dispatch, unless `--workgroups` says: 8 per compute unit of an
/// H100 or H200 (132 units; wgpu does not report the count), which also fills
/// smaller GPUs. `--workgroups 132` gives one a unit, as the v1 model's last
/// conv has (128 blocks).
const WORKGROUPS: u32 = 132 * 8;
/// K slices the `workgroup` mode rotates through, so no load can be hoisted.
const SLICES: u32 = 4;

struct Args {
    rounds: u32,
    repeats: usize,
    workgroups: u32,
    /// Only the configurations whose operands' name starts with this.
    operands: String,
}

impl Args {
    fn parse() -> std::result::Result<Self, String> {
        let mut args = Args {
            rounds: 2048,
            repeats: 5,
            workgroups: WORKGROUPS,
            operands: String::new(),
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(format!("{flag} needs a value\n{USAGE}"))?;
            if flag == "--operands" {
                args.operands = value;
                continue;
            }
            let count: u32 = value
                .parse()
                .ok()
                .filter(|&v| v > 0)
                .ok_or(format!("{flag}: {value} is not a positive count\n{USAGE}"))?;
            match flag.as_str() {
                "--rounds" => args.rounds = count,
                "--repeats" => args.repeats = count as usize,
                "--workgroups" => args.workgroups = count,
                _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
            }
        }
        Ok(args)
    }
}

/// Where a subgroup's operand tiles come from each round.
#[derive(Clone, Copy, PartialEq)]
enum Operands {
    /// Loaded once before the loop: the matrix units alone.
    Registers,
    /// Workgroup memory as f16, column-major tiles T halves apart.
    F16Columns,
    /// Workgroup memory as vec4<f16>, row-major tiles (`coopLoadT`) whose rows
    /// are `padding` halves longer than a tile: the conv kernels' layout (their
    /// staged rows are 8 halves longer than 32 or 64; at tile 16, padding 24
    /// gives the halo kernel's 40-half rows).
    Vec4Rows { padding: u32 },
    /// The conv GEMM core's step (coop_gemm.wgsl): runs staged in workgroup
    /// memory, barriers, then the step's loads and multiply-adds.
    Staged(Staged),
    /// The forward conv's operands straight from global memory every round,
    /// no workgroup memory and no barriers: A tiles as NHWC pixels by
    /// channels (rows 64 halves apart, the 3 x 3 taps shifting the pixels of
    /// 8-wide images), B tiles from weights 128 halves wide: the v1 model's
    /// last conv (8x8x64 -> 128) without staging.
    Global,
}

/// The staged mode: every round each invocation writes its share of a BM x
/// BK slice of A and a BK x BN slice of B (runs of 8 halves) into workgroup
/// memory, a barrier, the subgroups multiply the `k_tiles` k-tiles staged, a
/// barrier: the core's rhythm. Its runs come from a 4 MiB buffer (`global`,
/// fetched a round ahead, as the core does) or are made up in registers,
/// which prices the staging alone.
#[derive(Clone, Copy, PartialEq)]
struct Staged {
    global: bool,
    k_tiles: u32,
}

/// Halves in the buffer the staged mode fetches from (4 MiB: it stays in L2,
/// as the v1 convs' operands do).
const STAGED_SOURCE: u32 = 2 << 20;

impl Operands {
    fn name(&self) -> String {
        match self {
            Operands::Registers => "registers".into(),
            Operands::F16Columns => "f16 cols".into(),
            Operands::Vec4Rows { padding } => format!("vec4 rows+{padding}"),
            Operands::Staged(Staged { global, k_tiles }) => format!(
                "staged {} k{k_tiles}",
                if *global { "global" } else { "regs" }
            ),
            Operands::Global => "global direct".into(),
        }
    }
}

/// One configuration: subgroups a workgroup, accumulator tiles a subgroup,
/// and where its operands come from every round.
#[derive(Clone, Copy)]
struct Config {
    subgroups: u32,
    tiles: [u32; 2],
    operands: Operands,
}

impl Config {
    /// Its pipeline's key in the context's cache: every field its WGSL is
    /// written from.
    fn key(&self) -> PipelineKey {
        let (source, padding, global, k_tiles) = match self.operands {
            Operands::Registers => (0, 0, false, 1),
            Operands::F16Columns => (1, 0, false, 1),
            Operands::Vec4Rows { padding } => (2, padding, false, 1),
            Operands::Staged(Staged { global, k_tiles }) => (3, 0, global, k_tiles),
            Operands::Global => (4, 0, true, 1),
        };
        let mut key = PipelineKey::new("coop_peak", "coop");
        key.source_constants = vec![
            ("SUBGROUPS", self.subgroups),
            ("TM", self.tiles[0]),
            ("TN", self.tiles[1]),
            ("OPERANDS", source),
            ("PADDING", padding),
            ("GLOBAL", u32::from(global)),
            ("K_TILES", k_tiles),
        ];
        key
    }

    /// The kernel's WGSL for tile size `t` and subgroup size `lanes`.
    fn source(&self, t: u32, lanes: u32) -> String {
        if let Operands::Staged(staged) = self.operands {
            return self.staged_source(t, lanes, staged);
        }
        if self.operands == Operands::Global {
            return self.global_source(t, lanes);
        }
        let [tm, tn] = self.tiles;
        let mat = format!("coop_mat{t}x{t}");
        let count = tm + tn;
        let threads = self.subgroups * lanes;
        // A tile's size in stage elements, its row stride and its load.
        let (element, tile, stride, load) = match self.operands {
            Operands::Vec4Rows { padding } => {
                let stride = (t + padding) / 4;
                ("vec4<f16>", t * stride, stride, "coopLoadT")
            }
            _ => ("f16", t * t, t, "coopLoad"),
        };
        let fill = if element == "f16" {
            "stage[i] = src[i % n];"
        } else {
            "let e = 4u * i; stage[i] = vec4<f16>(src[e % n], src[(e + 1u) % n], src[(e + 2u) % n], src[(e + 3u) % n]);"
        };
        let mut src = format!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n\
             const T: u32 = {t}u;\n\
             const TILE: u32 = {tile}u;\nconst SLICE: u32 = {count}u * TILE;\n\
             @group(0) @binding(0) var<storage, read> src: array<f16>;\n\
             @group(0) @binding(1) var<storage, read_write> dst: array<f32>;\n\
             var<workgroup> stage: array<{element}, {SLICES}u * SLICE>;\n\
             override ROUNDS: u32;\n\
             @compute @workgroup_size({threads})\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32,\n\
                     @builtin(subgroup_id) sg: u32) {{\n\
             \x20   let n = arrayLength(&src);\n\
             \x20   for (var i = lidx; i < {SLICES}u * SLICE; i += {threads}u) {{ {fill} }}\n\
             \x20   workgroupBarrier();\n",
        );
        for o in 0..count {
            let role = if o < tm { "A" } else { "B" };
            src +=
                &format!("    var op_{o} = coopLoad<{mat}<f16, {role}>>(&src[{o}u * T * T], T);\n");
        }
        src += &self.accumulators(&mat);
        src += "    for (var round = 0u; round < ROUNDS; round++) {\n";
        if self.operands != Operands::Registers {
            src += &format!("        let slice = (round % {SLICES}u) * SLICE;\n");
            for o in 0..count {
                let role = if o < tm { "A" } else { "B" };
                src += &format!(
                    "        op_{o} = {load}<{mat}<f16, {role}>>(&stage[slice + {o}u * TILE], {stride}u);\n"
                );
            }
        }
        for i in 0..tm {
            for j in 0..tn {
                let b = tm + j;
                src += &format!(
                    "        acc_{i}_{j} = coopMultiplyAdd(op_{i}, op_{b}, acc_{i}_{j});\n"
                );
            }
        }
        src += "    }\n";
        src += &self.stores();
        src
    }

    /// The staged mode's WGSL: the GEMM core's step on a block of
    /// `subgroups / 4 x 4` subgroups (A and B staged row-major with 8 halves of
    /// padding, loaded with `coopLoadT`, as the core stages the forward's),
    /// `k_tiles` deep.
    fn staged_source(&self, t: u32, lanes: u32, staged: Staged) -> String {
        let [tm, tn] = self.tiles;
        let mat = format!("coop_mat{t}x{t}");
        let Staged { global, k_tiles } = staged;
        let mut src = format!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n\
             alias Run = array<vec4<f16>, 2>;\n\
             const T: u32 = {t}u;\nconst SG_M: u32 = {sg_m}u;\nconst SG_N: u32 = 4u;\n\
             const TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\nconst KT: u32 = {k_tiles}u;\n\
             const GLOBAL: bool = {global};\n\
             const BM: u32 = SG_M * TM * T;\nconst BN: u32 = SG_N * TN * T;\nconst BK: u32 = KT * T;\n\
             const THREADS: u32 = {threads}u;\n\
             const LDA: u32 = BK / 4u + 2u;\nconst LDB: u32 = BN / 4u + 2u;\n\
             const A_SIZE: u32 = BM * LDA;\nconst B_SIZE: u32 = BK * LDB;\n\
             const A_GROUPS: u32 = BM * BK / 8u;\nconst B_GROUPS: u32 = BK * BN / 8u;\n\
             const A_SLOTS: u32 = (A_GROUPS + THREADS - 1u) / THREADS;\n\
             const B_SLOTS: u32 = (B_GROUPS + THREADS - 1u) / THREADS;\n\
             @group(0) @binding(0) var<storage, read> src: array<vec4<f16>>;\n\
             @group(0) @binding(1) var<storage, read_write> dst: array<f32>;\n\
             var<workgroup> stage_a: array<vec4<f16>, A_SIZE>;\n\
             var<workgroup> stage_b: array<vec4<f16>, B_SIZE>;\n\
             override ROUNDS: u32;\n",
            sg_m = self.subgroups / 4,
            threads = self.subgroups * lanes,
        );
        src += r#"
// Run g of this round's slices: from the source buffer, consecutive runs for
// consecutive invocations, or made up from the round.
fn fetch(round: u32, g: u32, wid: u32) -> Run {
    if (GLOBAL) {
        let q = ((wid * ROUNDS + round) * (A_GROUPS + B_GROUPS) + g) * 2u % arrayLength(&src);
        return Run(src[q], src[q + 1u]);
    }
    let v = f16(round & 7u) * 0.125h;
    return Run(vec4<f16>(v), vec4<f16>(v));
}

fn fetch_all(regs_a: ptr<function, array<Run, A_SLOTS>>, regs_b: ptr<function, array<Run, B_SLOTS>>,
             round: u32, lidx: u32, wid: u32) {
    for (var s = 0u; s < A_SLOTS; s++) { (*regs_a)[s] = fetch(round, lidx + s * THREADS, wid); }
    for (var s = 0u; s < B_SLOTS; s++) { (*regs_b)[s] = fetch(round, A_GROUPS + lidx + s * THREADS, wid); }
}

// Writes this invocation's runs into the staged slices.
fn stage(regs_a: ptr<function, array<Run, A_SLOTS>>, regs_b: ptr<function, array<Run, B_SLOTS>>,
         lidx: u32) {
    for (var s = 0u; s < A_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < A_GROUPS) {
            let slot = (g / (BK / 8u)) * LDA + (g % (BK / 8u)) * 2u;
            stage_a[slot] = (*regs_a)[s][0];
            stage_a[slot + 1u] = (*regs_a)[s][1];
        }
    }
    for (var s = 0u; s < B_SLOTS; s++) {
        let g = lidx + s * THREADS;
        if (g < B_GROUPS) {
            let slot = (g / (BN / 8u)) * LDB + (g % (BN / 8u)) * 2u;
            stage_b[slot] = (*regs_b)[s][0];
            stage_b[slot + 1u] = (*regs_b)[s][1];
        }
    }
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32,
        @builtin(subgroup_id) sg: u32) {
    let sub_row = (sg / SG_N) * TM * T;
    let sub_col = (sg % SG_N) * TN * T;
    var regs_a: array<Run, A_SLOTS>;
    var regs_b: array<Run, B_SLOTS>;
    fetch_all(&regs_a, &regs_b, 0u, lidx, wid.x);
"#;
        src += &self.accumulators(&mat);
        let mut multiply = String::from("        for (var kk = 0u; kk < BK; kk += T) {\n");
        multiply += &operand_loads(
            &mat,
            [tm, tn],
            |i| format!("&stage_a[(sub_row + {i}u * T) * LDA + kk / 4u], LDA"),
            |j| format!("&stage_b[kk * LDB + (sub_col + {j}u * T) / 4u], LDB"),
        );
        multiply += &multiply_adds(tm, tn);
        multiply += "        }\n";
        src += "    for (var round = 0u; round < ROUNDS; round++) {\n\
                 \x20       stage(&regs_a, &regs_b, lidx);\n\
                 \x20       workgroupBarrier();\n\
                 \x20       fetch_all(&regs_a, &regs_b, round + 1u, lidx, wid.x);\n";
        src += &multiply;
        src += "        workgroupBarrier();\n    }\n";
        src += &self.stores();
        src
    }

    /// The direct mode's WGSL: each subgroup of a `subgroups / 4 x 4` block
    /// loads its TM A tiles and TN B tiles from the storage buffer every
    /// round, walking the 36 k-tiles of a 576-deep reduction (9 taps of 64
    /// channels) over 16384 pixel rows (batch 256 of 8 x 8), as conv 5's
    /// forward would with no staging (its padding left out).
    fn global_source(&self, t: u32, lanes: u32) -> String {
        let [tm, tn] = self.tiles;
        let mat = format!("coop_mat{t}x{t}");
        let mut src = format!(
            "enable f16;\nenable wgpu_cooperative_matrix;\n\
             const T: u32 = {t}u;\nconst SG_N: u32 = 4u;\n\
             const TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\n\
             const BM: u32 = {sg_m}u * TM * T;\n\
             const PIXELS: u32 = 16384u;\nconst CHANNELS: u32 = 64u;\nconst WIDTH: u32 = 128u;\n\
             const WEIGHTS: u32 = 1572864u;\n\
             @group(0) @binding(0) var<storage, read> src: array<f16>;\n\
             @group(0) @binding(1) var<storage, read_write> dst: array<f32>;\n\
             override ROUNDS: u32;\n\
             @compute @workgroup_size({threads})\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lidx: u32,\n\
             \x20       @builtin(subgroup_id) sg: u32) {{\n\
             \x20   let sub_row = (sg / SG_N) * TM * T;\n\
             \x20   let sub_col = (sg % SG_N) * TN * T;\n\
             \x20   let first = (wid.x * BM) % PIXELS + sub_row;\n",
            sg_m = self.subgroups / 4,
            threads = self.subgroups * lanes,
        );
        src += &self.accumulators(&mat);
        src += "    for (var round = 0u; round < ROUNDS; round++) {\n\
                 \x20       let k = (round % 36u) * T;\n\
                 \x20       let tap = k / CHANNELS;\n\
                 \x20       let shift = (tap / 3u) * 8u + tap % 3u;\n";
        src += &operand_loads(
            &mat,
            [tm, tn],
            |i| format!("&src[(first + {i}u * T + shift) * CHANNELS + k % CHANNELS], CHANNELS"),
            |j| format!("&src[WEIGHTS + k * WIDTH + sub_col + {j}u * T], WIDTH"),
        );
        src += &multiply_adds(tm, tn);
        src += "    }\n";
        src += &self.stores();
        src
    }

    /// The TM x TN accumulator tiles, zeroed.
    fn accumulators(&self, mat: &str) -> String {
        let [tm, tn] = self.tiles;
        let mut src = String::new();
        for i in 0..tm {
            for j in 0..tn {
                src += &format!("    var acc_{i}_{j} = {mat}<f32, C>();\n");
            }
        }
        src
    }

    /// The kernel's end: each subgroup's accumulators stored to its own tiles
    /// of `dst`, so no multiply-add can be left out.
    fn stores(&self) -> String {
        let [tm, tn] = self.tiles;
        let mut src = format!(
            "    let tile0 = ((wid.x * {}u + sg) * {}u) * T * T;\n",
            self.subgroups,
            tm * tn
        );
        for i in 0..tm {
            for j in 0..tn {
                let index = i * tn + j;
                src += &format!("    coopStore(acc_{i}_{j}, &dst[tile0 + {index}u * T * T], T);\n");
            }
        }
        src + "}\n"
    }

    fn flops(&self, t: u32, rounds: u32, workgroups: u32) -> f64 {
        let [tm, tn] = self.tiles;
        let k_tiles = match self.operands {
            Operands::Staged(staged) => staged.k_tiles,
            _ => 1,
        };
        f64::from(workgroups)
            * f64::from(self.subgroups * tm * tn * k_tiles)
            * f64::from(rounds)
            * 2.0
            * f64::from(t).powi(3)
    }
}

fn gpu_error(message: String) -> AetherError {
    AetherError::Gpu {
        during: "coop_peak",
        message,
    }
}

fn main() -> Result<()> {
    xdg::quiet_missing_runtime_dir();
    let args = Args::parse().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2);
    });
    let ctx = GpuContext::new(&GpuOptions::from_env()?)?
        .ok_or_else(|| gpu_error("no GPU adapter".into()))?;
    let caps = ctx.caps();
    println!("{}", caps.describe());
    let t = caps.coop_f16_f32_tile().ok_or_else(|| {
        gpu_error("the adapter has no f16 x f16 -> f32 cooperative matrix".into())
    })?;
    let lanes = match caps.subgroup_size {
        Some((min, max)) if min == max => max,
        other => return Err(gpu_error(format!("subgroup size {other:?} is not fixed"))),
    };
    println!(
        "{} workgroups, {} rounds, best of {}",
        args.workgroups, args.rounds, args.repeats
    );
    println!(
        "{:<16} {:>9} {:>6} {:>10} {:>9}",
        "operands", "subgroups", "tiles", "ms", "TFLOP/s"
    );
    let device = ctx.device();
    let values: Vec<half::f16> = (0..STAGED_SOURCE)
        .map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 400.0))
        .collect();
    let src = wgpu::util::DeviceExt::create_buffer_init(
        device,
        &wgpu::util::BufferInitDescriptor {
            label: Some("coop_peak operands"),
            contents: bytemuck::cast_slice(&values),
            usage: wgpu::BufferUsages::STORAGE,
        },
    );
    for config in configs()
        .into_iter()
        .filter(|config| config.operands.name().starts_with(&args.operands))
    {
        let Config {
            subgroups, tiles, ..
        } = config;
        let dst = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("coop_peak accumulators"),
            size: u64::from(args.workgroups * subgroups * tiles[0] * tiles[1] * t * t * 4),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let key = config.key().with("ROUNDS", args.rounds);
        let pipeline = match ctx
            .pipelines()
            .require(&key, "main", || config.source(t, lanes).into())
        {
            Ok(pipeline) => pipeline,
            Err(e) => {
                println!("{subgroups} x {tiles:?}: does not build: {e}");
                continue;
            }
        };
        let buffers = [GpuSlice::whole(&src), GpuSlice::whole(&dst)];
        let mut best = f64::INFINITY;
        for repeat in 0..=args.repeats {
            let started = Instant::now();
            let ((), ns) = ctx.timed_span(|| {
                ctx.dispatch(
                    "coop_peak",
                    &pipeline,
                    &buffers,
                    &[],
                    [args.workgroups, 1, 1],
                )
            })?;
            let ms = ns / 1e6;
            if repeat > 0 && ms > 0.0 {
                best = best.min(ms);
            }
            if started.elapsed().as_secs() > 10 {
                break;
            }
        }
        println!(
            "{:<16} {:>9} {:>6} {:>10.4} {:>9.2}",
            config.operands.name(),
            subgroups,
            format!("{}x{}", tiles[0], tiles[1]),
            best,
            config.flops(t, args.rounds, args.workgroups) / best / 1e9
        );
    }
    ctx.check_faults("coop_peak")
}

/// Each unstaged operand source with 8 and 16 subgroups of 1 to 16 tiles,
/// less 16 subgroups of 4 x 4 tiles (160 registers an invocation, which
/// spill); the staged step fed both ways, 2 k-tiles deep on the core's blocks
/// for the v1 convs (16 subgroups of 2 x 2 tiles) and for wide GEMMs (16 of
/// 2 x 4) and on 8 subgroups of 4 x 4, and 4 deep on the first. (4 deep on 16
/// subgroups of 2 x 4 tiles ran for minutes on an H100, presumably spilling.)
/// The direct mode on the blocks a conv-5 kernel without staging could take
/// (8 or 16 subgroups of 1 x 2 to 2 x 4 tiles).
fn configs() -> Vec<Config> {
    let sources = [
        Operands::Registers,
        Operands::F16Columns,
        Operands::Vec4Rows { padding: 0 },
        Operands::Vec4Rows { padding: 8 },
        Operands::Vec4Rows { padding: 24 },
    ];
    let mut configs = Vec::new();
    for operands in sources {
        for subgroups in [8, 16] {
            for tiles in [[1, 1], [2, 2], [2, 4], [4, 4]] {
                if subgroups * tiles[0] * tiles[1] <= 128 {
                    configs.push(Config {
                        subgroups,
                        tiles,
                        operands,
                    });
                }
            }
        }
    }
    for (subgroups, tiles) in [
        (16, [2, 2]),
        (16, [1, 2]),
        (8, [2, 2]),
        (8, [2, 4]),
        (16, [2, 4]),
    ] {
        configs.push(Config {
            subgroups,
            tiles,
            operands: Operands::Global,
        });
    }
    for global in [false, true] {
        for (subgroups, tiles, k_tiles) in [
            (16, [2, 2], 2),
            (16, [2, 4], 2),
            (8, [4, 4], 2),
            (16, [2, 2], 4),
        ] {
            configs.push(Config {
                subgroups,
                tiles,
                operands: Operands::Staged(Staged { global, k_tiles }),
            });
        }
    }
    configs
}

/// `let a_i = coopLoadT(...)` for the TM A tiles and `let b_j` for the TN B
/// tiles, each from the pointer and stride `a(i)` / `b(j)` give.
fn operand_loads(
    mat: &str,
    [tm, tn]: [u32; 2],
    a: impl Fn(u32) -> String,
    b: impl Fn(u32) -> String,
) -> String {
    let mut out = String::new();
    for i in 0..tm {
        out += &format!(
            "            let a_{i} = coopLoadT<{mat}<f16, A>>({});\n",
            a(i)
        );
    }
    for j in 0..tn {
        out += &format!(
            "            let b_{j} = coopLoadT<{mat}<f16, B>>({});\n",
            b(j)
        );
    }
    out
}

/// `acc_i_j = coopMultiplyAdd(a_i, b_j, acc_i_j)` for every tile.
fn multiply_adds(tm: u32, tn: u32) -> String {
    let mut out = String::new();
    for i in 0..tm {
        for j in 0..tn {
            out +=
                &format!("            acc_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, acc_{i}_{j});\n");
        }
    }
    out
}
