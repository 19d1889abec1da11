//! The microvm tier's own failures, carried as `Error::Tier` (match them
//! with `Error::tier_error::<MicroVmError>()`).

use std::path::PathBuf;
use std::time::Duration;

use super::accel::Accel;

/// Why a microVM could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MicroVmError {
    /// No guest kernel where one was looked for.
    #[error("no guest kernel; looked at {searched:?} (run scripts/microvm-up.sh, or name one with --kernel or NAMZU_MICROVM_KERNEL)")]
    KernelNotFound {
        /// Where it looked.
        searched: Vec<PathBuf>,
    },
    /// The VMM's binary is not installed.
    #[error("{vmm}: binary not found; looked at {searched:?} (Debian: apt-get install qemu-system-x86)")]
    VmmNotFound {
        /// The VMM.
        vmm: &'static str,
        /// Where it looked.
        searched: Vec<PathBuf>,
    },
    /// A tool the tier needs is not installed.
    #[error("{tool}: not found; looked at {searched:?}")]
    ToolNotFound {
        /// The tool.
        tool: &'static str,
        /// Where it looked.
        searched: Vec<PathBuf>,
    },
    /// The VMM offers no link transport the anchor speaks.
    #[error("{vmm} offers no link the anchor speaks (offered {offered}; the anchor speaks virtio-serial)")]
    TransportUnavailable {
        /// The VMM.
        vmm: &'static str,
        /// What it offered.
        offered: String,
    },
    /// The accelerator asked for cannot be used here.
    #[error("accelerator {accel} is unusable here: {reason}")]
    AccelUnavailable {
        /// The accelerator.
        accel: Accel,
        /// Why.
        reason: String,
    },
    /// The initramfs could not be built.
    #[error("initramfs: {reason}")]
    Initramfs {
        /// Why.
        reason: String,
    },
    /// A disk could not be built.
    #[error("disk {}: {reason}", path.display())]
    Disk {
        /// The disk.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The guest's agent did not answer within the boot budget.
    #[error(
        "sandbox {id}: the guest's agent did not answer within {budget:?}; console tail:\n{console_tail}\n{anchor_log}"
    )]
    BootTimeout {
        /// The sandbox.
        id: String,
        /// The budget.
        budget: Duration,
        /// The last of the guest's console.
        console_tail: String,
        /// The last of the anchor's and the VMM's logs.
        anchor_log: String,
    },
    /// The VM ended before its agent answered.
    #[error(
        "sandbox {id}: the VM ended ({status}) before its agent answered; console tail:\n{console_tail}\n{anchor_log}"
    )]
    GuestExited {
        /// The sandbox.
        id: String,
        /// How the anchor ended.
        status: String,
        /// The last of the guest's console.
        console_tail: String,
        /// The last of the anchor's and the VMM's logs.
        anchor_log: String,
    },
}
