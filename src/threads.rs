//! What may cross threads, checked at compile time.
//!
//! - [`Device`], [`GpuContext`], [`Tensor`] and [`AetherError`] are `Send + Sync`:
//!   one device (and its pipeline cache and buffer pool) serves any number of
//!   threads, and tensors can be shared read-only between them.
//! - [`Model`] is `Send` but not `Sync`: move a model to the thread that trains
//!   it; training needs `&mut Model`, so one model is never trained from two
//!   threads at once. Its layers are `Send` for the same reason.
//! - [`TrainOptions`] and [`Checkpoint`] are `Send + Sync`.
//!
//! Several models may train at once on one device, each on its own thread:
//! their kernels share the device's pending command batch (recorded under a
//! lock, in the order each thread records them) but no buffers, so each model
//! computes exactly what it computes alone (`tests/threads.rs`).

use crate::gpu::GpuContext;
use crate::{AetherError, Checkpoint, Device, Model, Tensor, TrainOptions};

const fn send_sync<T: Send + Sync>() {}
const fn send<T: Send>() {}

/// Implemented twice for a `Sync` type, so naming `check` for one is an
/// ambiguity error: `<T as NotSync<_>>::check` compiles only where T is not
/// `Sync` (the trick of static_assertions' `assert_not_impl_any!`).
trait NotSync<A> {
    fn check() {}
}
impl<T: ?Sized> NotSync<()> for T {}
impl<T: ?Sized + Sync> NotSync<u8> for T {}

const _: fn() = <Model as NotSync<_>>::check;

const _: () = {
    send_sync::<Device>();
    send_sync::<GpuContext>();
    send_sync::<Tensor>();
    send_sync::<AetherError>();
    send_sync::<TrainOptions<'static>>();
    send_sync::<Checkpoint>();
    send::<Model>();
};
