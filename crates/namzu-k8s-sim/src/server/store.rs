//! The simulator's store as the API server keeps it: reads, writes that
//! bump `resourceVersion` (and `generation` on a spec change), and
//! deletion — at once, but for a pod bound to a node, which is only marked
//! (`deletionTimestamp`) until its kubelet purges it.

use serde_json::{json, Value};

use super::{new_uid, now_rfc3339, schema, Gvr, Simulator};

impl Simulator {
    /// Every stored object of a resource, in every namespace.
    pub fn all(&self, (g, v, p): Gvr) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((og, ov, op, _, _), _)| og == g && ov == v && op == p)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Stores `obj` as the controller writes it: a new object gets its uid
    /// and creation time; every write a new resourceVersion.
    pub fn put(&self, (g, v, p): Gvr, mut obj: Value) -> Value {
        if let Some(s) = self
            .types
            .get(&(g.to_owned(), v.to_owned(), p.to_owned()))
            .and_then(|t| t.schema.as_ref())
        {
            schema::apply_defaults(s, &mut obj);
        }
        let mut store = self.lock();
        store.revision += 1;
        let meta = &mut obj["metadata"];
        if meta["uid"].is_null() {
            meta["uid"] = json!(new_uid());
            meta["creationTimestamp"] = json!(now_rfc3339());
            meta["generation"] = json!(1);
        }
        meta["resourceVersion"] = json!(store.revision.to_string());
        let key = (
            g.to_owned(),
            v.to_owned(),
            p.to_owned(),
            meta["namespace"].as_str().unwrap_or_default().to_owned(),
            meta["name"].as_str().unwrap_or_default().to_owned(),
        );
        store.objects.insert(key, obj.clone());
        obj
    }

    /// Changes the object as stored NOW (not a copy read earlier), under
    /// the store's lock: how the controller writes status or one field
    /// without overwriting a host's concurrent patch. `None`: it is gone.
    pub fn update(&self, (g, v, p): Gvr, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Option<Value> {
        let mut store = self.lock();
        let key = (g.to_owned(), v.to_owned(), p.to_owned(), ns.to_owned(), name.to_owned());
        let current = store.objects.get(&key)?.clone();
        let mut next = current.clone();
        f(&mut next);
        if next == current {
            return Some(current);
        }
        store.revision += 1;
        next["metadata"]["resourceVersion"] = json!(store.revision.to_string());
        if next["spec"] != current["spec"] {
            let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(g + 1);
        }
        store.objects.insert(key, next.clone());
        Some(next)
    }

    /// Deletes an object as the API server does: at once, but for a pod
    /// bound to a node, which is only marked (`deletionTimestamp`, its
    /// grace period) for its kubelet to stop and then [`Simulator::purge`].
    /// What was stored, if anything.
    pub fn remove(&self, gvr: Gvr, ns: &str, name: &str) -> Option<Value> {
        self.delete_with(gvr, ns, name, None)
    }

    /// [`Simulator::remove`] with a DELETE's `gracePeriodSeconds` (0: at once).
    pub(super) fn delete_with(
        &self,
        (g, v, p): (&str, &str, &str),
        ns: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Option<Value> {
        let mut store = self.lock();
        let key = (g.to_owned(), v.to_owned(), p.to_owned(), ns.to_owned(), name.to_owned());
        let current = store.objects.get(&key)?.clone();
        let bound = p == "pods" && g.is_empty() && current["spec"]["nodeName"].is_string();
        if bound && grace != Some(0) {
            if !current["metadata"]["deletionTimestamp"].is_null() {
                return Some(current);
            }
            let grace = grace
                .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30)
                .max(1);
            let at = std::time::SystemTime::now() + std::time::Duration::from_secs(grace.unsigned_abs());
            let mut next = current;
            store.revision += 1;
            next["metadata"]["deletionTimestamp"] = json!(namzu_kubernetes::build::rfc3339(at));
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            next["metadata"]["resourceVersion"] = json!(store.revision.to_string());
            store.objects.insert(key, next.clone());
            return Some(next);
        }
        store.revision += 1;
        store.objects.remove(&key)
    }

    /// Removes an object at once, whatever it is: the kubelet's last word
    /// on a pod whose containers have stopped.
    pub fn purge(&self, (g, v, p): Gvr, ns: &str, name: &str) -> Option<Value> {
        let mut store = self.lock();
        let key = (g.to_owned(), v.to_owned(), p.to_owned(), ns.to_owned(), name.to_owned());
        let gone = store.objects.remove(&key);
        if gone.is_some() {
            store.revision += 1;
        }
        gone
    }

    /// An object as stored, for tests and the controller to come.
    pub fn object(&self, group: &str, version: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let key = (group.into(), version.into(), plural.into(), ns.into(), name.into());
        self.lock().objects.get(&key).cloned()
    }
}
