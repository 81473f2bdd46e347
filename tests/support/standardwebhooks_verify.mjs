// Verifies captured deliveries with the npm `standardwebhooks` library, as a Node receiver would.
// argv[2]: the folder whose node_modules holds the library. stdin: a JSON list of cases
// {secret, raw, body, headers, later_s}; stdout: a JSON list, per case null (accepted) or the
// library's error message. `raw`: the secret is text whose UTF-8 bytes are the key (a secret
// without the whsec_ prefix); `later_s`: verified that many seconds after now (a replay).
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(path.join(process.argv[2], "package.json"));
const { Webhook } = require("standardwebhooks");

const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const realNow = Date.now;
const answers = cases.map(({ secret, raw, body, headers, later_s }) => {
  Date.now = () => realNow() + (later_s || 0) * 1000;
  try {
    const hook = raw ? new Webhook(Buffer.from(secret, "utf8"), { format: "raw" }) : new Webhook(secret);
    hook.verify(body, headers);
    return null;
  } catch (error) {
    return `${error.name}: ${error.message}`;
  } finally {
    Date.now = realNow;
  }
});
process.stdout.write(JSON.stringify(answers));
