// The unmodified E2B JavaScript SDK against `namzu serve`: create, run,
// files, kill. E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the
// server. Prints one line per step; exits non-zero on the first failure.
import assert from "node:assert/strict";
import { Sandbox, CommandExitError } from "e2b";

const sbx = await Sandbox.create({ metadata: { suite: "e2b-js" } });
console.log("created", sbx.sandboxId);
const r = await sbx.commands.run("echo js-out; echo js-err >&2");
assert.equal(r.stdout, "js-out\n");
assert.equal(r.stderr, "js-err\n");
assert.equal(r.exitCode, 0);
await assert.rejects(sbx.commands.run("exit 6"), (e) => e instanceof CommandExitError && e.exitCode === 6);
console.log("commands ok");
await sbx.files.write("/workspace/js.txt", "from node");
assert.equal(await sbx.files.read("/workspace/js.txt"), "from node");
const names = (await sbx.files.list("/workspace")).map((e) => e.name);
assert.deepEqual(names, ["js.txt"]);
console.log("files ok");
const listed = await Sandbox.list({ query: { metadata: { suite: "e2b-js" } } }).nextItems();
assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId));
assert.equal(await sbx.kill(), true);
assert.equal(await Sandbox.kill(sbx.sandboxId), false);
console.log("killed");
