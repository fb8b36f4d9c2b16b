//! A SwiGLU block's gate and up projections, as stored or fused into one product whose outputs are
//! the gate's hidden units, then the up's (see `nn::set_fused_projections`): the dense MLP's
//! ([`super::Linear`]) and the routed experts' ([`super::switch::SwitchLinear`]).
use crate::error::Result;
use crate::shard::{self, ShardMode};
use mlx::distributed::Group;
use mlx::Array;

/// What a projection gives a [`GateUp`]: one layer from several stored alike, its arrays, its
/// output size and its tensor-parallel part (`segments`: the output sizes of the layers fused in it).
pub(crate) trait Projection: Sized {
    fn fuse(parts: &[&Self]) -> Result<Option<Self>>;
    fn arrays(&self) -> Vec<&Array>;
    fn out_dims(&self) -> i32;
    fn shard(&self, mode: ShardMode, segments: &[i32], group: &Group) -> Result<Self>;
}

#[derive(Clone)]
pub(crate) enum GateUp<T> {
    Separate { gate: T, up: T },
    /// The gate's `hidden` outputs, then the up's.
    Fused(T, i32),
}

impl<T: Projection> GateUp<T> {
    /// `gate` and `up` of `hidden` outputs each, fused into one layer when
    /// `nn::fused_projections()` is on and they are stored alike.
    pub(crate) fn new(gate: T, up: T, hidden: i32) -> Result<GateUp<T>> {
        let fused = if super::fused_projections() { T::fuse(&[&gate, &up])? } else { None };
        Ok(match fused {
            Some(f) => GateUp::Fused(f, hidden),
            None => GateUp::Separate { gate, up },
        })
    }

    pub(crate) fn arrays(&self) -> Vec<&Array> {
        match self {
            GateUp::Separate { gate, up } => [gate.arrays(), up.arrays()].concat(),
            GateUp::Fused(f, _) => f.arrays(),
        }
    }

    /// This rank's block of the hidden units (`what` names the hidden size in the error where the
    /// group does not divide it).
    pub(crate) fn shard(&self, group: &Group, what: &str) -> Result<GateUp<T>> {
        Ok(match self {
            GateUp::Separate { gate, up } => GateUp::Separate {
                gate: gate.shard(ShardMode::AllToSharded, &[gate.out_dims()], group)?,
                up: up.shard(ShardMode::AllToSharded, &[up.out_dims()], group)?,
            },
            GateUp::Fused(f, hidden) => GateUp::Fused(
                f.shard(ShardMode::AllToSharded, &[*hidden, *hidden], group)?,
                shard::check_divides(what, *hidden, group.size())?,
            ),
        })
    }
}

impl<T> GateUp<T> {
    /// (up, gate) for x through `f` (one product of each projection, or one of the fused one split
    /// at `hidden` on the last axis).
    pub(crate) fn up_gate(&self, f: impl Fn(&T) -> Result<Array>) -> Result<(Array, Array)> {
        match self {
            GateUp::Separate { gate, up } => Ok((f(up)?, f(gate)?)),
            GateUp::Fused(w, hidden) => {
                let y = f(w)?; // (..., 2 hidden)
                Ok((y.slice_axis(-1, *hidden, 2 * hidden)?, y.slice_axis(-1, 0, *hidden)?))
            }
        }
    }

    /// The same projections through `f`, or `None` where `f` gives none for one of them.
    pub(crate) fn try_map<'a, U>(&'a self, f: impl Fn(&'a T) -> Option<U>) -> Option<GateUp<U>> {
        Some(match self {
            GateUp::Separate { gate, up } => GateUp::Separate { gate: f(gate)?, up: f(up)? },
            GateUp::Fused(w, hidden) => GateUp::Fused(f(w)?, *hidden),
        })
    }
}
