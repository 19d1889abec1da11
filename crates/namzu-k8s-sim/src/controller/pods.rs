//! The pod side of the controller: every pod a real local-tier (or host)
//! sandbox, started, published with its address, and stopped.

use super::*;
use namzu_proto::link_tls::ServerFiles;

impl Controller {
    /// Starts a runtime for every pod without one, stops those whose pod
    /// is gone.
    pub(super) fn pods(self: &Arc<Self>, sim: &Arc<Simulator>) {
        self.terminate(sim);
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
            tokio::spawn(rt.stop(Duration::ZERO));
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
            if !self.begin_start(&k) {
                return;
            }
            // Scheduled: bound to the node (which makes its deletion
            // graceful) before the kubelet starts it.
            let Some(pod) = sim.update(PODS, meta(pod, "namespace"), meta(pod, "name"), |p| {
                p["spec"]["nodeName"] = json!(NODE_NAME);
                p["status"]["conditions"] = json!([condition("PodScheduled", true, "", "")]);
            }) else {
                self.lock().starting.remove(&k);
                continue;
            };
            let ctl = self.clone();
            let sim = sim.clone();
            tokio::spawn(async move {
                let started = ctl.run_pod(&sim, &pod, fault == Some(PodFault::Unconfined), None).await;
                if ctl.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(rt) = started {
                        rt.stop(Duration::ZERO).await;
                    }
                } else {
                    ctl.publish(&sim, &pod, started);
                }
                ctl.lock().starting.remove(&k);
            });
        }
    }

    /// Writes a started pod's status (or its crash).
    fn publish(&self, sim: &Arc<Simulator>, pod: &Value, started: Result<PodRuntime, kubelet::PodError>) {
        let (ns, name) = (meta(pod, "namespace"), meta(pod, "name"));
        let current = sim
            .all(PODS)
            .into_iter()
            .find(|p| meta(p, "namespace") == ns && meta(p, "name") == name && meta(p, "uid") == meta(pod, "uid"));
        let container = pod["spec"]["containers"][0]["name"].clone();
        let deleting = current
            .as_ref()
            .is_some_and(|c| !c["metadata"]["deletionTimestamp"].is_null());
        match (current.filter(|_| !deleting), started) {
            // Deleted while it started: stopped, then gone.
            (None, Ok(rt)) if deleting => {
                let (sim, ns, name, uid) = (sim.clone(), ns.to_owned(), name.to_owned(), meta(pod, "uid").to_owned());
                tokio::spawn(async move {
                    rt.stop(Duration::ZERO).await;
                    purge_if(&sim, &ns, &name, &uid);
                });
            }
            (None, Err(_)) if deleting => purge_if(sim, ns, name, meta(pod, "uid")),
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
                tokio::spawn(rt.stop(Duration::ZERO));
            }
            (None, Err(_)) => {}
        }
    }

    /// Pods marked for deletion (`deletionTimestamp`), as a kubelet ends
    /// them: no longer Ready at once, the containers stopped (SIGTERM, the
    /// agent's quiesce) within the grace period, then the object removed.
    fn terminate(self: &Arc<Self>, sim: &Arc<Simulator>) {
        for p in sim.all(PODS) {
            if p["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let (ns, name, uid) = (meta(&p, "namespace"), meta(&p, "name"), meta(&p, "uid"));
            let k = key(ns, name);
            if self.lock().starting.contains(&k) {
                continue; // publish() ends it once started
            }
            let rt = {
                let mut st = self.lock();
                match st.running.get(&k) {
                    Some(rt) if rt.uid == uid => st.running.remove(&k),
                    _ => None,
                }
            };
            let Some(rt) = rt else {
                if !self.lock().stopping.contains(&k) {
                    purge_if(sim, ns, name, uid);
                }
                continue;
            };
            sim.update(PODS, ns, name, |p| {
                if let Some(conds) = p["status"]["conditions"].as_array_mut() {
                    for c in conds
                        .iter_mut()
                        .filter(|c| c["type"] == "Ready" || c["type"] == "ContainersReady")
                    {
                        c["status"] = json!("False");
                    }
                }
            });
            let grace = Duration::from_secs(p["metadata"]["deletionGracePeriodSeconds"].as_u64().unwrap_or(30));
            self.lock().stopping.insert(k.clone());
            let (ctl, sim, ns, name, uid) = (
                self.clone(),
                sim.clone(),
                ns.to_owned(),
                name.to_owned(),
                uid.to_owned(),
            );
            tokio::spawn(async move {
                // The grace period is the SIGTERM's; what is left after it
                // is killed, as a kubelet's SIGKILL does.
                if tokio::time::timeout(grace + Duration::from_secs(10), rt.stop(grace))
                    .await
                    .is_err()
                {
                    tracing::warn!(pod = %name, ?grace, "the pod outlived its grace period");
                }
                purge_if(&sim, &ns, &name, &uid);
                ctl.lock().stopping.remove(&key(&ns, &name));
            });
        }
    }

    /// Runs `pod`: a sandbox whose agent takes the token the container's
    /// environment names, and a relay on a fresh pod IP at the agent port.
    async fn run_pod(
        &self,
        sim: &Simulator,
        pod: &Value,
        unconfined: bool,
        keep_ip: Option<std::net::Ipv4Addr>,
    ) -> Result<PodRuntime, kubelet::PodError> {
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
            spec.binds.extend(prepared.binds.iter().cloned());
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
            podnet::attach_veth(&dir, self.id, keep_ip).await
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
            podnet::attach_relay(dir.join("agent.sock"), port, tls, keep_ip).await
        };
        let net = match net {
            Ok(n) => n,
            Err(e) => {
                let _ = sandbox.destroy().await;
                return Err(crash(e));
            }
        };
        let anchor = std::fs::read(dir.join("meta.json"))
            .ok()
            .and_then(|m| serde_json::from_slice::<Value>(&m).ok())
            .and_then(|m| m["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok());
        Ok(PodRuntime {
            uid: pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            net,
            sandbox,
            volumes: prepared.volumes,
            anchor,
        })
    }
}

impl Controller {
    /// Restarts pod `ns/name`'s container as a kubelet does after it
    /// exited (`restartPolicy: Always`): the same pod — uid, IP, volumes
    /// and claims — with a new container: a new agent process (a new boot
    /// id), none of the old one's processes, a fresh root filesystem
    /// (what was written outside the volumes is gone), `restartCount` one
    /// up. Not Ready while it restarts; returns once it is Ready again.
    pub async fn restart_container(self: &Arc<Self>, sim: &Arc<Simulator>, ns: &str, name: &str) -> Result<(), String> {
        let k = key(ns, name);
        let old = {
            let mut st = self.lock();
            if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("the controller is stopped".into());
            }
            let rt = st.running.remove(&k).ok_or_else(|| format!("pod {k} is not running"))?;
            st.starting.insert(k.clone());
            rt
        };
        let ready = |p: &mut Value, ready: bool| {
            let s = if ready { "True" } else { "False" };
            for c in p["status"]["conditions"].as_array_mut().into_iter().flatten() {
                if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                    c["status"] = json!(s);
                }
            }
            p["status"]["containerStatuses"][0]["ready"] = json!(ready);
        };
        sim.update(PODS, ns, name, |p| {
            ready(p, false);
            p["status"]["containerStatuses"][0]["state"] =
                json!({"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now_rfc3339()}});
        });
        let ip = old.net.ip;
        // The container's processes end; the pod's volumes stay.
        let _ = old.sandbox.destroy().await;
        old.net.detach().await;
        let pod = sim
            .object(PODS.0, PODS.1, PODS.2, ns, name)
            .filter(|p| meta(p, "uid") == old.uid)
            .ok_or_else(|| format!("pod {k} went away"));
        let started = match pod {
            Ok(pod) => self.run_pod(sim, &pod, false, Some(ip)).await.map_err(|e| e.message),
            Err(e) => Err(e),
        };
        let out = started.map(|rt| {
            sim.update(PODS, ns, name, |p| {
                ready(p, true);
                let c = &mut p["status"]["containerStatuses"][0];
                c["restartCount"] = json!(c["restartCount"].as_u64().unwrap_or(0) + 1);
                c["lastState"] = json!({"terminated": {"exitCode": 137, "reason": "Error"}});
                c["state"] = json!({"running": {"startedAt": now_rfc3339()}});
            });
            self.lock().running.insert(k.clone(), rt);
        });
        self.lock().starting.remove(&k);
        out
    }
}

/// Removes pod `name` if it is still the one with `uid`.
fn purge_if(sim: &Simulator, ns: &str, name: &str, uid: &str) {
    let same = sim
        .object(PODS.0, PODS.1, PODS.2, ns, name)
        .is_some_and(|p| meta(&p, "uid") == uid);
    if same {
        sim.purge(PODS, ns, name);
    }
}
