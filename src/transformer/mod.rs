//! The Transformer core: attention, position encodings and layers, built from the plain settings of
//! `spec` (which needs no libtorch). Nothing here knows about recipes.
pub mod spec;

#[cfg(feature = "torch")]
pub mod attention;
#[cfg(feature = "torch")]
pub mod layers;
#[cfg(feature = "torch")]
pub mod norm;
#[cfg(feature = "torch")]
pub mod positions;
