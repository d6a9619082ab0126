// Counts what a host shows the model of each tool (its name, description and inputSchema as
// tools/list sends them) in cl100k_base tokens, with npm's gpt-tokenizer (its encodings are
// bundled: nothing is downloaded at run time).
// usage: node count_tokens.mjs NODE_DIR < tools.json   (prints {"total": N, "tools": {name: N}})
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(path.join(process.argv[2], 'package.json'));
const { encode } = require('gpt-tokenizer/encoding/cl100k_base');
const tools = JSON.parse(fs.readFileSync(0, 'utf8'));
const out = { total: 0, tools: {} };
for (const t of tools) {
  const n = encode(t.name + (t.description || '') + JSON.stringify(t.inputSchema)).length;
  out.tools[t.name] = n;
  out.total += n;
}
console.log(JSON.stringify(out));
