// The client against servers that misbehave on purpose (a Unix socket in a temp folder); the real
// daemon is test/daemon.test.js, run by the Python suite with a daemon serving a workspace.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";

import {
  ClawmemClient,
  DaemonUnreachable,
  DiskFull,
  IndexUnavailable,
  PathError,
  ProtocolError,
  QueryError,
  RequestTimeout,
  ServerBusy,
  defaultSocketPath,
  workspaceKey,
} from "../index.js";

const dir = mkdtempSync(path.join(tmpdir(), "cmc-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let serial = 0;

/** A server answering each request line with `answer(request, socket)`; counts its connections. */
async function serve(answer) {
  const socketPath = path.join(dir, `s${serial++}.sock`);
  const sockets = new Set();
  const server = net.createServer((socket) => {
    server.connections += 1;
    sockets.add(socket);
    let buffer = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk) => {
      buffer += chunk;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        answer(JSON.parse(line), socket);
      }
    });
    socket.on("error", () => {});
  });
  server.connections = 0;
  await new Promise((resolve) => server.listen(socketPath, resolve));
  const close = () => {
    for (const socket of sockets) socket.destroy();
    return new Promise((resolve) => server.close(resolve));
  };
  return { server, socketPath, close };
}

/** Run `body` with a server and a client, both closed whatever happens (a failed assertion must not hang the run). */
async function withServer(answer, options, body) {
  const served = await serve(answer);
  const client = new ClawmemClient({ socketPath: served.socketPath, ...options });
  try {
    await body(client, served.server);
  } finally {
    client.close();
    await served.close();
  }
}

const BOUND = { timeout: 10_000 };

const reply = (socket, id, body) => socket.write(JSON.stringify({ jsonrpc: "2.0", id, ...body }) + "\n");

test("a client's requests get their own answers, in camelCase-free params, and reuse its connections", BOUND, async () => {
  const seen = [];
  const answer = (request, socket) => {
    seen.push(request);
    reply(socket, request.id, { result: { method: request.method, params: request.params ?? null } });
  };
  await withServer(answer, {}, async (client, server) => {
    const [search, status] = await Promise.all([
      client.search("platypus", { maxResults: 3, minScore: 0, pathPrefix: "memory/", mode: "bm25" }),
      client.status(),
    ]);
    const got = await client.get("MEMORY.md", { from: 2, lines: 5 });
    assert.deepEqual(search.params, { query: "platypus", max_results: 3, min_score: 0, path_prefix: "memory/", mode: "bm25" });
    assert.equal(status.method, "status");
    assert.deepEqual(got.params, { path: "MEMORY.md", from: 2, lines: 5 });
    assert.equal(server.connections, 2); // two at once, then one of them again
    assert.deepEqual(seen.map((r) => r.jsonrpc), ["2.0", "2.0", "2.0"]);
  });
});

/** A server that, as the daemon, handles one request per connection at a time; `handle` may take its time. */
async function serveInOrder(handle) {
  return serve((() => {
    const queues = new WeakMap();
    return (request, socket) => {
      const before = queues.get(socket) ?? Promise.resolve();
      queues.set(socket, before.then(() => handle(request, socket)));
    };
  })());
}

test("requests in flight at once each have a connection: none waits behind another", BOUND, async () => {
  let started = 0;
  let open;
  const allStarted = new Promise((resolve) => { open = resolve; });
  const served = await serveInOrder(async (request, socket) => {
    if (++started === 4) open();
    await allStarted; // answered only once four requests are being handled at once
    reply(socket, request.id, { result: { n: request.params.query } });
  });
  const client = new ClawmemClient({ socketPath: served.socketPath, timeoutMs: 5_000 });
  try {
    const answers = await Promise.all(["a", "b", "c", "d"].map((q) => client.search(q)));
    assert.deepEqual(answers.map((a) => a.n), ["a", "b", "c", "d"]);
    assert.equal(served.server.connections, 4);
  } finally {
    client.close();
    await served.close();
  }
});

test("past maxConnections requests wait for a connection, and all are answered", BOUND, async () => {
  const served = await serveInOrder(async (request, socket) => reply(socket, request.id, { result: request.params.query }));
  const client = new ClawmemClient({ socketPath: served.socketPath, maxConnections: 2 });
  try {
    const queries = Array.from({ length: 9 }, (_, i) => `q${i}`);
    assert.deepEqual(await Promise.all(queries.map((q) => client.search(q))), queries);
    assert.ok(served.server.connections <= 2, `${served.server.connections} connections`);
  } finally {
    client.close();
    await served.close();
  }
});

test("one request past its deadline fails alone: its connection is closed, the others are answered", BOUND, async () => {
  let closedOnce;
  const closedSeen = new Promise((resolve) => { closedOnce = resolve; });
  let release;
  const late = new Promise((resolve) => { release = resolve; });
  const served = await serve((request, socket) => {
    socket.on("close", closedOnce);
    if (request.params?.query === "slow") return; // never answered
    late.then(() => reply(socket, request.id, { result: { fresh: true } }));
  });
  const client = new ClawmemClient({ socketPath: served.socketPath, timeoutMs: 5_000 });
  try {
    const slow = client.request("search", { query: "slow" }, { timeoutMs: 100 });
    const status = client.status();
    await assert.rejects(slow, (e) => e instanceof RequestTimeout && e instanceof DaemonUnreachable && /within 100 ms/.test(e.message));
    await closedSeen; // the daemon is told: the slow request's connection is gone
    release();
    assert.deepEqual(await status, { fresh: true });
  } finally {
    client.close();
    await served.close();
  }
});

test("a cancelled request closes its connection and fails at once", BOUND, async () => {
  const served = await serve(() => {}); // never answers
  const client = new ClawmemClient({ socketPath: served.socketPath, timeoutMs: 5_000 });
  try {
    const controller = new AbortController();
    const pending = client.request("sync", { wait: true }, { signal: controller.signal });
    setImmediate(() => controller.abort());
    await assert.rejects(pending, (e) => e instanceof DaemonUnreachable && /cancelled/.test(e.message));
  } finally {
    client.close();
    await served.close();
  }
});

test("a busy daemon's turn-away is ServerBusy, not 'unreachable'", BOUND, async () => {
  const socketPath = path.join(dir, `busy${serial++}.sock`);
  const sockets = [];
  const server = net.createServer((socket) => {
    sockets.push(socket);
    socket.on("error", () => {});
    socket.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "too many connections: try again later" } }) + "\n");
  });
  await new Promise((resolve) => server.listen(socketPath, resolve));
  const client = new ClawmemClient({ socketPath, timeoutMs: 5_000 });
  try {
    await assert.rejects(client.status(), (e) => e instanceof ServerBusy && /too many connections/.test(e.message));
  } finally {
    client.close();
    for (const socket of sockets) socket.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("reply lines are read whole across many chunks, and one longer than any answer fails the request", BOUND, async () => {
  const big = "x".repeat(1_000_000);
  const answer = (request, socket) => {
    if (request.method === "status") {
      const line = JSON.stringify({ jsonrpc: "2.0", id: request.id, result: { big } }) + "\n";
      for (let at = 0; at < line.length; at += 4096) socket.write(line.slice(at, at + 4096));
    } else {
      const chunk = "y".repeat(1 << 20);
      for (let i = 0; i < 6; i++) socket.write(chunk); // 6 MiB and no newline
    }
  };
  await withServer(answer, { timeoutMs: 5_000 }, async (client) => {
    assert.equal((await client.status()).big.length, big.length);
    await assert.rejects(client.search("x"), (e) => e instanceof ProtocolError && /longer than/.test(e.message));
  });
});

test("the daemon's error classes arrive by the name it sends, beyond what the code tells", BOUND, async () => {
  const answer = (request, socket) => reply(socket, request.id, {
    error: { code: -32030, message: "no space left on the index's disk", data: { type: "DiskFull" } } });
  await withServer(answer, {}, async (client) => {
    await assert.rejects(client.status(), (e) => e instanceof DiskFull && e instanceof IndexUnavailable);
  });
});

test("an idle connection the daemon closed meanwhile costs nothing: the next request goes on a new one", BOUND,
  async () => {
  // Each connection answers one request, then is closed by the server (as a daemon's idle limit or eviction does).
  const served = await serve((request, socket) => {
    socket.end(JSON.stringify({ jsonrpc: "2.0", id: request.id, result: { n: request.params.query } }) + "\n");
  });
  const client = new ClawmemClient({ socketPath: served.socketPath, timeoutMs: 5_000 });
  try {
    for (const q of ["a", "b", "c"]) assert.deepEqual(await client.search(q), { n: q });
    assert.equal(served.server.connections, 3);
  } finally {
    client.close();
    await served.close();
  }
});

test("a client not closed does not keep its process alive once its requests are answered", BOUND, async () => {
  const served = await serve((request, socket) => reply(socket, request.id, { result: { fresh: true } }));
  const script = path.join(dir, `forgetful${serial++}.mjs`);
  writeFileSync(script, `import { ClawmemClient } from ${JSON.stringify(new URL("../index.js", import.meta.url).href)};
const client = new ClawmemClient({ socketPath: ${JSON.stringify(served.socketPath)} });
console.log(JSON.stringify(await client.status())); // and no close()
`);
  try {
    const child = spawn(process.execPath, [script], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d) => { out += d; });
    const [code] = await once(child, "exit"); // the test's own timeout bounds this
    assert.equal(code, 0);
    assert.deepEqual(JSON.parse(out), { fresh: true });
  } finally {
    await served.close();
  }
});

test("the daemon's errors arrive as classes with its message and code", BOUND, async () => {
  const errors = {
    get: { code: -32011, message: "'../x' is refused: outside the workspace" },
    search: { code: -32012, message: "the query is empty" },
    status: { code: -32001, message: "server busy" },
    sync: { code: -32700, message: "parse error" },
  };
  const answer = (request, socket) => reply(socket, request.id, { error: errors[request.method] });
  await withServer(answer, {}, async (client) => {
    await assert.rejects(client.get("../x"), (e) => e instanceof PathError && e.code === -32011 && /refused/.test(e.message));
    await assert.rejects(client.search(""), (e) => e instanceof QueryError && e.message === "the query is empty");
    await assert.rejects(client.status(), (e) => e instanceof ServerBusy);
    await assert.rejects(client.sync(), (e) => e instanceof ProtocolError);
  });
});

test("a daemon that does not answer costs the deadline, and the next request starts a new connection", BOUND, async () => {
  const answer = (request, socket) => {
    if (request.method === "status") reply(socket, request.id, { result: { fresh: true } });
  };
  await withServer(answer, { timeoutMs: 200 }, async (client, server) => {
    const started = Date.now();
    await assert.rejects(client.search("slow"), (e) => e instanceof DaemonUnreachable && /within 200 ms/.test(e.message));
    assert.ok(Date.now() - started < 5_000);
    assert.deepEqual(await client.status(), { fresh: true });
    assert.equal(server.connections, 2);
  });
});

test("a connection closed mid-request or a line that is not JSON fails the waiting requests, not the process", BOUND,
  async () => {
  const answer = (request, socket) => {
    if (request.method === "search") socket.destroy();
    else socket.write("not json\n");
  };
  await withServer(answer, {}, async (client) => {
    await assert.rejects(client.search("x"), DaemonUnreachable);
    await assert.rejects(client.status(), (e) => e instanceof ProtocolError && /not JSON/.test(e.message));
  });
});

test("no daemon: a clear error naming the socket", BOUND, async () => {
  const socketPath = path.join(dir, "nobody.sock");
  const client = new ClawmemClient({ socketPath, timeoutMs: 1000 });
  await assert.rejects(client.status(), (e) => e instanceof DaemonUnreachable && e.message.includes(socketPath));
});

test("the socket path follows the CLI's rules", BOUND, () => {
  const ws = path.join(dir, "my ws é");
  assert.match(workspaceKey(ws), /^my_ws_é-[0-9a-f]{12}$/);
  assert.equal(defaultSocketPath(ws, { CLAWMEM_SOCKET: "/x.sock" }), "/x.sock");
  assert.equal(defaultSocketPath(ws, { XDG_RUNTIME_DIR: "/run/u" }), `/run/u/clawmem/${workspaceKey(ws)}.sock`);
  assert.equal(defaultSocketPath(ws, { XDG_CACHE_HOME: "/c" }), `/c/clawmem/run/${workspaceKey(ws)}.sock`);
});
