// A Node client for clawmem's socket API: newline-delimited JSON-RPC 2.0 over a Unix socket.
// Usage: node query.mjs SOCKET QUERY
// Sends a search, a status, a malformed line and a get on one connection; prints the four answers
// as one JSON array on stdout.
import net from "node:net";

const [socketPath, query] = process.argv.slice(2);
const requests = [
  { jsonrpc: "2.0", id: 1, method: "search", params: { query, mode: "bm25", min_score: 0 } },
  { jsonrpc: "2.0", id: 2, method: "status" },
  "this line is not JSON",
  { jsonrpc: "2.0", id: 3, method: "get", params: { path: "MEMORY.md", from: 1, lines: 1 } },
];

const answers = [];
let buffer = "";
const conn = net.createConnection(socketPath);
conn.setEncoding("utf8");
conn.setTimeout(10000, () => {
  console.error("timed out");
  process.exit(2);
});
conn.on("connect", () => {
  for (const r of requests) conn.write((typeof r === "string" ? r : JSON.stringify(r)) + "\n");
});
conn.on("data", (chunk) => {
  buffer += chunk;
  let end;
  while ((end = buffer.indexOf("\n")) >= 0) {
    answers.push(JSON.parse(buffer.slice(0, end)));
    buffer = buffer.slice(end + 1);
  }
  if (answers.length === requests.length) {
    console.log(JSON.stringify(answers));
    conn.end();
  }
});
conn.on("error", (err) => {
  console.error(err.message);
  process.exit(1);
});
