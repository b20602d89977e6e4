//! What an adapter can do, read once when the context is created, and what
//! aether needs of a device.

use crate::error::{AetherError, Result};

/// One cooperative-matrix configuration reported by the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMatrixConfig {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Element type of the A and B operands.
    pub ab: wgpu::CooperativeScalarType,
    /// Element type of the accumulator and result.
    pub cr: wgpu::CooperativeScalarType,
}

impl std::fmt::Display for CoopMatrixConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{} {:?}->{:?}",
            self.m, self.n, self.k, self.ab, self.cr
        )
    }
}

/// The capabilities aether's kernels choose between.
#[derive(Clone, Debug)]
pub struct GpuCapabilities {
    pub adapter_name: String,
    pub backend: wgpu::Backend,
    pub device_type: wgpu::DeviceType,
    pub driver: String,
    pub shader_f16: bool,
    /// `(min, max)` subgroup size when subgroup operations are available.
    pub subgroup_size: Option<(u32, u32)>,
    pub timestamps: bool,
    pub pipeline_cache: bool,
    /// Bytes of immediate data (push constants) a pipeline may use; 0 without the feature.
    pub immediate_bytes: u32,
    /// Cooperative-matrix configurations the kernels may use: empty when the adapter
    /// has none or `AETHER_DISABLE_COOP=1` switched them off.
    pub coop_matrix: Vec<CoopMatrixConfig>,
    /// True when the adapter offered cooperative matrices but they were disabled.
    pub coop_disabled: bool,
    pub limits: wgpu::Limits,
}

/// Immediate-data bytes an adapter must offer for kernel parameters to move
/// there (wgpu's guaranteed size where the feature exists).
pub const PARAMS_IMMEDIATE_BYTES: u32 = 128;

impl GpuCapabilities {
    /// The most loop iterations one invocation may run, all its loops
    /// together, where the driver cuts them short silently: llvmpipe
    /// (lavapipe) stops an invocation after 65535 (its loop limiter), with
    /// wrong results and no error. `None` elsewhere. A kernel whose loops
    /// grow with the data splits them across dispatches, or refuses the
    /// shape with [`crate::AetherError::TooLarge`].
    pub fn loop_iteration_limit(&self) -> Option<u64> {
        let llvmpipe = |s: &str| s.to_ascii_lowercase().contains("llvmpipe");
        (llvmpipe(&self.driver) || llvmpipe(&self.adapter_name)).then_some(65535)
    }

    /// The features aether uses where a device has them (all optional).
    pub(crate) fn wanted_features(allow_coop: bool, allow_immediates: bool) -> wgpu::Features {
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::PIPELINE_CACHE;
        if allow_coop {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        if allow_immediates {
            wanted |= wgpu::Features::IMMEDIATES;
        }
        wanted
    }

    /// The capabilities of a device on `adapter` that has `features` and
    /// works within `limits`.
    pub(crate) fn read(
        adapter: &wgpu::Adapter,
        features: wgpu::Features,
        limits: wgpu::Limits,
        coop_disabled: bool,
    ) -> Self {
        let info = adapter.get_info();
        let coop_matrix = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            adapter
                .cooperative_matrix_properties()
                .into_iter()
                .map(|p| CoopMatrixConfig {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    ab: p.ab_type,
                    cr: p.cr_type,
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            adapter_name: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_owned(),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroup_size: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            pipeline_cache: features.contains(wgpu::Features::PIPELINE_CACHE),
            immediate_bytes: if features.contains(wgpu::Features::IMMEDIATES) {
                limits.max_immediate_size
            } else {
                0
            },
            coop_matrix,
            coop_disabled,
            limits,
        }
    }

    /// Compute units of the adapter where they are known: listed parts, and
    /// CPU adapters (lavapipe runs workgroups on one thread per core). wgpu
    /// does not report them.
    pub fn known_compute_units(&self) -> Option<u32> {
        let name = self.adapter_name.to_ascii_uppercase();
        let known = [
            ("H200", 132),
            ("H100", 132),
            ("A100", 108),
            ("L40", 142),
            ("4090", 128),
        ];
        if let Some(&(_, units)) = known.iter().find(|(part, _)| name.contains(part)) {
            return Some(units);
        }
        (self.device_type == wgpu::DeviceType::Cpu).then(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(2)
        })
    }

    /// Compute units of the adapter, for sizing grids: the known count, else
    /// an estimate from the device type.
    pub fn estimated_compute_units(&self) -> u32 {
        self.known_compute_units()
            .unwrap_or(match self.device_type {
                wgpu::DeviceType::DiscreteGpu => 64,
                _ => 16,
            })
    }

    /// The most bytes one tensor may take: every kernel binds a tensor's
    /// buffer whole, so both `max_storage_buffer_binding_size` and
    /// `max_buffer_size` bound it.
    pub fn max_tensor_bytes(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Whether kernels take their parameter block as immediate data (set in the
    /// pass, no buffer or binding) rather than as a uniform buffer. Every
    /// aether parameter block fits in `PARAMS_IMMEDIATE_BYTES`.
    pub fn params_in_immediates(&self) -> bool {
        self.immediate_bytes >= PARAMS_IMMEDIATE_BYTES
    }

    /// The largest square f16 x f16 -> f32 cooperative tile (16 or 8) the adapter
    /// offers; naga only has square `coop_mat8x8` and `coop_mat16x16` types.
    pub fn coop_f16_f32_tile(&self) -> Option<u32> {
        use wgpu::CooperativeScalarType::{F16, F32};
        [16, 8].into_iter().find(|&t| {
            self.coop_matrix
                .iter()
                .any(|c| c.m == t && c.n == t && c.k == t && c.ab == F16 && c.cr == F32)
        })
    }

    /// A one-paragraph human summary, printed by examples and tests.
    pub fn describe(&self) -> String {
        let coop = if self.coop_matrix.is_empty() {
            if self.coop_disabled {
                "disabled by AETHER_DISABLE_COOP".to_owned()
            } else {
                "none".to_owned()
            }
        } else {
            self.coop_matrix
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "adapter {:?} ({:?}, {:?}, driver {:?}); shader-f16 {}, subgroups {}, timestamps {}, \
             pipeline-cache {}, immediates {} B, max storage binding {} B; cooperative matrix: {}",
            self.adapter_name,
            self.backend,
            self.device_type,
            self.driver,
            self.shader_f16,
            self.subgroup_size
                .map(|(lo, hi)| format!("{lo}..={hi}"))
                .unwrap_or_else(|| "no".into()),
            self.timestamps,
            self.pipeline_cache,
            self.immediate_bytes,
            self.limits.max_storage_buffer_binding_size,
            coop
        )
    }
}

/// Whether naga translates aether's cooperative-matrix kernels at `tile`
/// for `backend`, so that the planner may choose them there: to SPIR-V
/// (Vulkan) at both tiles; to MSL (Metal) at 8, the only size of Metal's
/// simdgroup matrices; never to HLSL (DX12) or GLSL, whose naga writers have
/// no cooperative matrices; wgpu's noop backend translates nothing and runs
/// nothing, but validates the WGSL (tests plan an H100's kernels there).
/// `tests/shader_portability.rs` translates every kernel for each backend
/// this allows.
pub fn coop_translates_to(backend: wgpu::Backend, tile: u32) -> bool {
    match backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Noop => true,
        wgpu::Backend::Metal => tile == 8,
        _ => false,
    }
}

/// One device limit aether's kernels need, with the least value they run
/// with. Kernels whose needs grow with the adapter (the cooperative-matrix
/// and halo blocks) check the device's limits when they are planned instead.
#[derive(Clone, Copy, Debug)]
pub struct RequiredLimit {
    /// The field of [`wgpu::Limits`].
    pub name: &'static str,
    pub least: u32,
    field: fn(&mut wgpu::Limits) -> &mut u32,
}

impl RequiredLimit {
    /// This limit's value in `limits`.
    pub fn of(&self, limits: &wgpu::Limits) -> u32 {
        *(self.field)(&mut limits.clone())
    }

    /// This limit's field in `limits`.
    pub fn field_mut<'l>(&self, limits: &'l mut wgpu::Limits) -> &'l mut u32 {
        (self.field)(limits)
    }
}

/// `limits` with each of [`REQUIRED_LIMITS`] raised to what aether needs: the
/// limits for an app to request its device with, from its own or
/// [`wgpu::Limits::default()`] (one storage buffer short). The adapter must
/// offer them; every desktop GPU does.
pub fn with_required_limits(mut limits: wgpu::Limits) -> wgpu::Limits {
    for required in REQUIRED_LIMITS {
        let field = required.field_mut(&mut limits);
        *field = (*field).max(required.least);
    }
    limits
}

/// What a device must offer for aether to run on it: every kernel fits these,
/// and one kernel needs each (`tests/shader_portability.rs` measures them).
/// WebGPU's defaults ([`wgpu::Limits::default()`]) are one short: BatchNorm's
/// backward with f16 gradients binds 9 storage buffers; see
/// [`with_required_limits`].
pub const REQUIRED_LIMITS: [RequiredLimit; 8] = [
    RequiredLimit {
        name: "max_bind_groups",
        least: 1,
        field: |l| &mut l.max_bind_groups,
    },
    RequiredLimit {
        name: "max_bindings_per_bind_group",
        least: REQUIRED_STORAGE_BUFFERS + 1,
        field: |l| &mut l.max_bindings_per_bind_group,
    },
    RequiredLimit {
        name: "max_storage_buffers_per_shader_stage",
        least: REQUIRED_STORAGE_BUFFERS,
        field: |l| &mut l.max_storage_buffers_per_shader_stage,
    },
    RequiredLimit {
        name: "max_uniform_buffers_per_shader_stage",
        least: 1,
        field: |l| &mut l.max_uniform_buffers_per_shader_stage,
    },
    RequiredLimit {
        name: "max_compute_invocations_per_workgroup",
        least: 256,
        field: |l| &mut l.max_compute_invocations_per_workgroup,
    },
    RequiredLimit {
        name: "max_compute_workgroup_size_x",
        least: 256,
        field: |l| &mut l.max_compute_workgroup_size_x,
    },
    RequiredLimit {
        name: "max_compute_workgroup_size_y",
        least: 32,
        field: |l| &mut l.max_compute_workgroup_size_y,
    },
    RequiredLimit {
        name: "max_compute_workgroup_storage_size",
        least: 8192,
        field: |l| &mut l.max_compute_workgroup_storage_size,
    },
];

/// The most storage buffers one aether kernel binds.
const REQUIRED_STORAGE_BUFFERS: u32 = 9;

/// `Ok` when a device on `adapter` working within `limits` can run aether's
/// kernels, else [`AetherError::DeviceRequirement`] naming what is missing.
pub(crate) fn check_requirements(adapter: &wgpu::Adapter, limits: &wgpu::Limits) -> Result<()> {
    let adapter_name = adapter.get_info().name;
    let downlevel = adapter.get_downlevel_capabilities();
    if !downlevel
        .flags
        .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
    {
        return Err(AetherError::DeviceRequirement {
            adapter: adapter_name,
            requirement: "compute shaders (DownlevelFlags::COMPUTE_SHADERS)",
            needed: "present".into(),
            actual: "absent".into(),
        });
    }
    match REQUIRED_LIMITS.iter().find(|r| r.of(limits) < r.least) {
        Some(r) => Err(AetherError::DeviceRequirement {
            adapter: adapter_name,
            requirement: r.name,
            needed: format!("at least {}", r.least),
            actual: r.of(limits).to_string(),
        }),
        None => Ok(()),
    }
}
