//! Container images as the roots of VMs: what an image reference means, and an image read
//! from an OCI image layout (index, the guest's platform, config, layers), every blob checked
//! against its digest. Below ops; knows no VM.

pub mod layout;
pub mod reference;
pub mod unpack;
