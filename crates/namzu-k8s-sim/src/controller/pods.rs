//! The pod side of the controller: every pod a real local-tier (or host)
//! sandbox, started, published with its address, and stopped.

use super::*;
use namzu_proto::link_tls::ServerFiles;

impl Controller {
    /// Starts a runtime for every pod without one, stops those whose pod
    /// is gone.
    pub(super) fn pods(self: &Arc<Self>, sim: &Arc<Simulator>) {
        let pods = sim.all(PODS);
        let live: HashMap<String, &Value> = pods
            .iter()
            .map(|p| (key(meta(p, "namespace"), meta(p, "name")), p))
            .collect();
        let stale: Vec<PodRuntime> = {
            let mut st = self.lock();
            let gone: Vec<String> = st
                .running
                .iter()
                .filter(|(k, rt)| {
                    live.get(*k)
                        .is_none_or(|p| meta(p, "uid") != rt.uid || p["status"]["phase"] == "Failed")
                })
                .map(|(k, _)| k.clone())
                .collect();
            gone.iter().filter_map(|k| st.running.remove(k)).collect()
        };
        for rt in stale {
            tokio::spawn(rt.stop());
        }
        for (k, pod) in live {
            let pending = pod["status"]["phase"] == "Pending" && pod["status"]["conditions"].is_null();
            if !pending {
                continue;
            }
            if self.lock().running.contains_key(&k) || self.lock().starting.contains(&k) {
                continue;
            }
            let fault = *self.fault.lock().unwrap_or_else(|p| p.into_inner());
            match fault {
                Some(PodFault::Unschedulable) => {
                    let status = json!({"phase": "Pending", "conditions": [condition("PodScheduled", false, "Unschedulable",
                        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")]});
                    sim.update(PODS, meta(pod, "namespace"), meta(pod, "name"), |p| {
                        p["status"] = status
                    });
                    continue;
                }
                Some(PodFault::ImagePull) => {
                    let c = pod["spec"]["containers"][0]["name"].clone();
                    let status = json!({"phase": "Pending",
                        "conditions": [condition("PodScheduled", true, "", "")],
                        "containerStatuses": [{"name": c, "ready": false, "restartCount": 0, "image": pod["spec"]["containers"][0]["image"].clone(),
                            "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff",
                            "message": "Back-off pulling image: not found"}}}]});
                    sim.update(PODS, meta(pod, "namespace"), meta(pod, "name"), |p| {
                        p["status"] = status
                    });
                    continue;
                }
                _ => {}
            }
            self.lock().starting.insert(k.clone());
            let Some(pod) = sim.update(PODS, meta(pod, "namespace"), meta(pod, "name"), |p| {
                p["status"]["conditions"] = json!([condition("PodScheduled", true, "", "")]);
            }) else {
                self.lock().starting.remove(&k);
                continue;
            };
            let ctl = self.clone();
            let sim = sim.clone();
            tokio::spawn(async move {
                let started = ctl.run_pod(&sim, &pod, fault == Some(PodFault::Unconfined)).await;
                if ctl.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(rt) = started {
                        rt.stop().await;
                    }
                } else {
                    ctl.publish(&sim, &pod, started);
                }
                ctl.lock().starting.remove(&k);
            });
        }
    }

    /// Writes a started pod's status (or its crash).
    fn publish(&self, sim: &Simulator, pod: &Value, started: Result<PodRuntime, kubelet::PodError>) {
        let (ns, name) = (meta(pod, "namespace"), meta(pod, "name"));
        let current = sim
            .all(PODS)
            .into_iter()
            .find(|p| meta(p, "namespace") == ns && meta(p, "name") == name && meta(p, "uid") == meta(pod, "uid"));
        let container = pod["spec"]["containers"][0]["name"].clone();
        match (current, started) {
            (Some(_), Ok(rt)) => {
                let ip = rt.net.ip.to_string();
                let status = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now_rfc3339(),
                    "conditions": [condition("PodScheduled", true, "", ""), condition("Initialized", true, "", ""),
                        condition("ContainersReady", true, "", ""), condition("Ready", true, "", "")],
                    "containerStatuses": [{"name": container, "ready": true, "restartCount": 0, "started": true,
                        "image": pod["spec"]["containers"][0]["image"].clone(), "imageID": "",
                        "state": {"running": {"startedAt": now_rfc3339()}}}]});
                sim.update(PODS, ns, name, |p| p["status"] = status);
                self.lock().running.insert(key(ns, name), rt);
            }
            (Some(_), Err(why)) => {
                let failed = if why.container.is_empty() {
                    container
                } else {
                    json!(why.container)
                };
                let statuses = json!([{"name": failed, "ready": false, "restartCount": 1, "image": "", "imageID": "",
                    "state": {"waiting": {"reason": why.reason, "message": why.message}}}]);
                let mut status = json!({"phase": "Pending", "conditions": [condition("PodScheduled", true, "", "")]});
                status[if why.init {
                    "initContainerStatuses"
                } else {
                    "containerStatuses"
                }] = statuses;
                sim.update(PODS, ns, name, |p| p["status"] = status);
            }
            // The pod went away while it started.
            (None, Ok(rt)) => {
                tokio::spawn(rt.stop());
            }
            (None, Err(_)) => {}
        }
    }

    /// Runs `pod`: a sandbox whose agent takes the token the container's
    /// environment names, and a relay on a fresh pod IP at the agent port.
    async fn run_pod(&self, sim: &Simulator, pod: &Value, unconfined: bool) -> Result<PodRuntime, kubelet::PodError> {
        let prepared = kubelet::prepare(sim, pod, &self.cfg.state_dir).await?;
        let crash = |message: String| kubelet::PodError {
            reason: "CrashLoopBackOff",
            message,
            container: String::new(),
            init: false,
        };
        let c = &pod["spec"]["containers"][0];
        let token = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == namzu_kubernetes::build::TOKEN_ENV)
            .and_then(|e| match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.uid") => pod["metadata"]["uid"].as_str().map(String::from),
                Some("metadata.name") => pod["metadata"]["name"].as_str().map(String::from),
                Some(_) => None,
                None => e["value"].as_str().map(String::from),
            })
            .ok_or_else(|| crash("no bind token: the container has no NAMZU_AGENT_TOKEN".into()))?;
        let port = c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|a| {
                a.strip_prefix("tcp:")
                    .and_then(|r| r.rsplit(':').next()?.parse::<u16>().ok())
            })
            .unwrap_or(namzu_kubernetes::DEFAULT_AGENT_PORT);
        // The container's environment is the agent's; the agent reads its
        // limits from NAMZU_<LIMIT>, which the local tier takes as limits.
        let mut spec = SandboxSpec::default();
        for e in c["env"].as_array().into_iter().flatten() {
            let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) else {
                continue;
            };
            let limit = namzu::limits::ALL
                .iter()
                .find(|l| namzu::limits::env_var(l) == name)
                .map(|l| (*l).to_owned());
            match (limit, value.parse::<u64>()) {
                (Some(l), Ok(v)) => spec.limits.push((l, v)),
                _ => spec.env.push((name.to_owned(), value.to_owned())),
            }
        }
        let veth = self.net == podnet::Mode::Veth && !unconfined;
        let made = if unconfined {
            self.host
                .create_with_token(spec, Some(token.clone().into_bytes()))
                .await
        } else {
            // The workload's image is the sandbox's root; its agent is the
            // one the pod's own volumes (or image) hold.
            spec.image = Some(prepared.image.clone());
            let tcp = veth.then(|| format!("0.0.0.0:{port}"));
            // The egress supervisor is the node's, beside the host's agent.
            let egress = self.cfg.agent_bin.with_file_name(namzu::egress::supervisor::BINARY);
            LocalProvider::with_agent(&self.cfg.state_dir, &prepared.agent)
                .with_egress_bin(egress)
                .with_tcp_tls(prepared.tls.clone().filter(|_| veth))
                .create_with(spec, Some(token.clone().into_bytes()), tcp)
                .await
        };
        let sandbox: Sandbox = made.map_err(|e| crash(e.to_string()))?;
        let tier = if unconfined { "host" } else { "local" };
        let dir = self.cfg.state_dir.join(tier).join(sandbox.id());
        let net = if veth {
            podnet::attach_veth(&dir, self.id).await
        } else {
            // No pod network namespace to put the agent's TCP port on (not
            // root, or an unconfined pod on the host tier): the node's
            // relay serves the link's TLS, from the pod's own files.
            let tls = match prepared.tls.as_ref().map(ServerFiles::load).transpose() {
                Ok(t) => t,
                Err(e) => {
                    let _ = sandbox.destroy().await;
                    return Err(crash(format!("the link's TLS: {e}")));
                }
            };
            podnet::attach_relay(dir.join("agent.sock"), port, tls).await
        };
        let net = match net {
            Ok(n) => n,
            Err(e) => {
                let _ = sandbox.destroy().await;
                return Err(crash(e));
            }
        };
        Ok(PodRuntime {
            uid: pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            net,
            sandbox,
            volumes: prepared.volumes,
        })
    }
}
