//! The accelerator a guest runs with, and whether KVM is usable here.

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Accel {
    /// Hardware virtualisation (needs a usable /dev/kvm with VMX or SVM).
    Kvm,
    /// qemu's software emulation: works anywhere, much slower.
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// What the caller asked for: one accelerator, or whichever works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM where it is usable, else TCG (the choice is reported).
    #[default]
    Auto,
    /// This one, or a typed refusal.
    Only(Accel),
}

impl std::str::FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Only(Accel::Kvm)),
            "tcg" => Ok(Self::Only(Accel::Tcg)),
            _ => Err(format!("accel {s:?}: expected auto, kvm or tcg")),
        }
    }
}

/// Why KVM cannot be used here, or `None` when it can: /dev/kvm must open
/// read-write and the CPU must offer VMX or SVM (a guest of a PVM host has
/// /dev/kvm but no VMX, and stock kernels hang under it).
pub fn kvm_unusable() -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Some(format!("/dev/kvm: {e}"));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>();
    if !flags.contains(&"vmx") && !flags.contains(&"svm") {
        return Some(
            "the CPU offers neither VMX nor SVM (/dev/kvm exists, but a stock guest kernel would hang)".into(),
        );
    }
    None
}
