//! One sandbox's container, as the daemon is asked to create it: image,
//! user, mounts, tmpfs, capabilities, masked paths, limits, labels.

use std::collections::HashMap;
use std::path::Path;

use bollard::container::Config;
use bollard::models::HostConfig;

use super::*;
use crate::spec::SandboxSpec;

impl DockerProvider {
    pub(super) fn container_config(
        &self,
        id: &str,
        dir: &Path,
        spec: &SandboxSpec,
        image: &str,
        user: &str,
    ) -> Config<String> {
        let mut labels = HashMap::from([
            (labels::SANDBOX.to_owned(), id.to_owned()),
            (labels::INSTANCE.to_owned(), self.instance.clone()),
            (labels::STATE_DIR.to_owned(), self.state_root.display().to_string()),
            (labels::MACHINE.to_owned(), gc::machine_id()),
        ]);
        for (k, v) in &self.opts.labels {
            labels.insert(format!("{}{k}", labels::USER_PREFIX), v.clone());
        }
        let tmpfs_size = self.opts.tmpfs_bytes.unwrap_or(256 << 20);
        let tmpfs: HashMap<String, String> = self
            .opts
            .writable_paths()
            .into_iter()
            .map(|p| {
                let mode = match p.as_str() {
                    "/tmp" | "/var/tmp" => "1777",
                    "/root" => "700",
                    _ => "755",
                };
                // Docker makes a tmpfs noexec unless told: programs build and
                // run things in /tmp, as they do outside a sandbox.
                (p, format!("rw,exec,nosuid,nodev,size={tmpfs_size},mode={mode}"))
            })
            .collect();
        let mut binds = vec![
            format!("{}:{}:ro", self.agent_bin.display(), link::AGENT_PATH),
            format!("{}:/.namzu/run:rw", dir.join("run").display()),
            format!("{}:/workspace:rw", dir.join("workspace").display()),
        ];
        for b in &spec.binds {
            let mode = if b.writable { "rw" } else { "ro" };
            binds.push(format!("{}:{}:{mode}", b.source.display(), b.target.display()));
        }
        let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for (k, v) in &spec.limits {
            env.push(format!("{}={v}", namzu_proto::limits::env_var(k)));
        }
        let r = &spec.resources;
        let pids = r.pids.or(self.opts.default_pids_limit).unwrap_or(4096);
        let fsize = i64::try_from(self.opts.max_file_bytes.unwrap_or(16 << 30)).unwrap_or(i64::MAX);
        let memory = r.memory_bytes.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        let host = HostConfig {
            binds: Some(binds),
            // Hardening; see the module docs.
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(agent_caps(self.opts.runtime.as_deref())),
            security_opt: Some(
                std::iter::once("no-new-privileges:true".to_owned())
                    .chain(self.opts.seccomp_profile.as_ref().map(|p| format!("seccomp={p}")))
                    .collect(),
            ),
            ipc_mode: Some("private".into()),
            readonly_rootfs: Some(self.opts.read_only_rootfs != Some(false)),
            tmpfs: Some(tmpfs),
            network_mode: Some("none".into()),
            pids_limit: Some(i64::try_from(pids).unwrap_or(i64::MAX)),
            memory,
            // No swap beyond the memory limit.
            memory_swap: memory,
            nano_cpus: r.cpus.map(|c| (c * 1e9) as i64),
            runtime: self.opts.runtime.clone(),
            init: Some(false),
            // /sys is the host's (read-only) sysfs; nothing in a sandbox
            // needs it, so it is masked whole, with its cgroup mounts.
            masked_paths: Some(MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect()),
            ulimits: Some(vec![bollard::models::ResourcesUlimits {
                name: Some("fsize".into()),
                soft: Some(fsize),
                hard: Some(fsize),
            }]),
            ..Default::default()
        };
        let runtime = self.opts.runtime.clone().unwrap_or_else(|| "default".into());
        let mut reports = vec![
            format!("runtime={runtime}"),
            "capabilities=commands none; agent CapDrop ALL + SYS_ADMIN (start only), SETUID, SETGID, SETPCAP, KILL; no-new-privileges".into(),
            "ipc=private".into(),
            "network=none".into(),
            format!(
                "rootfs={}",
                if self.opts.read_only_rootfs == Some(false) {
                    "writable"
                } else {
                    "read-only"
                }
            ),
            format!(
                "cgroups=pids={pids}{}{}",
                memory.map_or(String::new(), |m| format!(",memory=cgroup:{m}")),
                r.cpus.map_or(String::new(), |c| format!(",cpu=cgroup:{c}")),
            ),
        ];
        reports.push(if super::is_gvisor(Some(&runtime)) {
            "seccomp=namzu filter only (gVisor loads no OCI profile inside)".into()
        } else {
            match &self.opts.seccomp_profile {
                None => "seccomp=daemon default profile + namzu filter".into(),
                Some(p) => format!("seccomp=daemon profile {p} + namzu filter"),
            }
        });
        let mut entrypoint: Vec<String> = vec![
            link::AGENT_PATH.into(),
            "--listen".into(),
            format!("unix:{}", link::AGENT_SOCKET),
            "--token-file".into(),
            "/.namzu/run/token".into(),
            "--consume-token".into(),
            "--root".into(),
            "/workspace".into(),
            "--root".into(),
            "/".into(),
            "--egress".into(),
            "--command-user".into(),
            user.to_owned(),
            "--tighten-mounts".into(),
        ];
        for r in reports {
            entrypoint.push("--report".into());
            entrypoint.push(r);
        }
        // Stacked on the daemon's profile (runc): what it leaves open (like
        // io_uring) the local tier's filter closes. Under gVisor, which
        // loads no OCI profile, it is the only filter, and what keeps a
        // command from making a user namespace and holding every
        // capability in it.
        entrypoint.push("--seccomp".into());
        if self.transport() == Transport::Back {
            entrypoint.extend(["--dial-back".into(), format!("/.namzu/run/{}", super::BACK_DIR)]);
        }
        if self.transport() == Transport::Socket {
            // The host connects to the socket's inode through its own path,
            // and the agent already runs: commands need see neither mount.
            for p in ["/.namzu/run", link::AGENT_PATH] {
                entrypoint.extend(["--hide".into(), p.into()]);
            }
        }
        Config {
            image: Some(image.to_owned()),
            // Root, for the agent's few capabilities; commands run as the
            // image's own user (`--command-user`).
            user: Some("0:0".into()),
            entrypoint: Some(entrypoint),
            cmd: Some(Vec::new()),
            working_dir: Some("/workspace".into()),
            env: Some(env),
            labels: Some(labels),
            network_disabled: Some(true),
            stop_signal: Some("SIGTERM".into()),
            host_config: Some(host),
            ..Default::default()
        }
    }
}
