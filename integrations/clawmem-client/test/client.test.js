// The client against servers that misbehave on purpose (a Unix socket in a temp folder); the real
// daemon is test/daemon.test.js, run by the Python suite with a daemon serving a workspace.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";

import {
  ClawmemClient,
  DaemonUnreachable,
  PathError,
  ProtocolError,
  QueryError,
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

test("requests share one connection and get their own answers, in camelCase-free params", BOUND, async () => {
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
    assert.equal(server.connections, 1);
    assert.deepEqual(seen.map((r) => r.jsonrpc), ["2.0", "2.0", "2.0"]);
  });
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
