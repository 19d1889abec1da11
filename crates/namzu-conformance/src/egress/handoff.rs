//! The one-relay path: where the agent's link is a unix socket of the
//! host's kernel (local, docker on runc), an allowed connection's client
//! socket is handed to the host, which relays it alone; elsewhere (a
//! gVisor or VM boundary, which carries no descriptor) the agent stays in
//! the path. Either way the bytes arrive whole, both through CONNECT (the
//! client's bytes relayed by the host too) and through the plain-HTTP
//! proxy (the request's body still cut by the agent).

use super::common::{allow, check, curl, sandbox, Env};
use crate::netlab::PUB1;
use crate::util::Ctx;
use crate::Outcome;

pub async fn an_allowed_connection_is_handed_to_the_host_where_the_link_can_carry_it(env: &Env) -> Outcome {
    let sb = sandbox(env, allow(&["allowed.test"])).await?;
    let before = sb.network().decisions().await.ctx("decisions")?;
    // -p: a CONNECT tunnel even for http, so both directions go through
    // whoever holds the client.
    let (codes, body) = curl(&sb, "-p http://allowed.test/").await;
    check(
        "through CONNECT",
        codes == "200 200" && body.contains(&format!("served by {PUB1}")),
        (&codes, &body),
    )?;
    let (codes, body) = curl(&sb, "-d posted-body http://allowed.test/").await;
    check(
        "through the plain-HTTP proxy, with a body",
        codes.starts_with("200") && body.contains(&format!("served by {PUB1}")),
        (&codes, &body),
    )?;
    let after = sb.network().decisions().await.ctx("decisions")?;
    let handed = after.handed_over - before.handed_over;
    let allowed = after.allowed - before.allowed;
    check("both allowed", allowed == 2, allowed)?;
    let expected = if env.handoff { 2 } else { 0 };
    check(
        if env.handoff {
            "both handed to the host (a unix link of the host's kernel)"
        } else {
            "none handed over (the boundary carries no descriptor)"
        },
        handed == expected,
        (handed, expected),
    )?;
    sb.destroy().await.ctx("destroy")
}
