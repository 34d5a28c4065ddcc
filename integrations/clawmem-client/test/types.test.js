// index.d.ts against index.js: every value the declarations export is exported, with the same kind, the same
// parent class and (for ClawmemClient) the same public methods, and nothing is exported undeclared. Not a type
// check of signatures (that needs TypeScript); the drift it catches is a name added, renamed or moved on one side.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as client from "../index.js";

const declarations = readFileSync(new URL("../index.d.ts", import.meta.url), "utf8");

/** The exported classes (with what they extend) and functions the declarations name. */
function declared() {
  const classes = new Map();
  for (const [, name, parent] of declarations.matchAll(/^export class (\w+)(?: extends (\w+))?/gm)) {
    classes.set(name, parent ?? null);
  }
  const functions = [...declarations.matchAll(/^export function (\w+)/gm)].map((m) => m[1]);
  return { classes, functions };
}

/** The methods a class body in the declarations lists (`name(`, at the body's indentation). */
function declaredMethods(className) {
  const body = declarations.split(`export class ${className}`)[1].split(/^}/m)[0];
  return [...body.matchAll(/^ {2}(\w+)\(/gm)].map((m) => m[1]).filter((name) => name !== "constructor").sort();
}

test("every export is declared, and every declared value is exported", () => {
  const { classes, functions } = declared();
  assert.deepEqual(Object.keys(client).sort(), [...classes.keys(), ...functions].sort());
  for (const name of functions) assert.equal(typeof client[name], "function", name);
});

test("each declared class is one, and extends what its declaration says", () => {
  for (const [name, parent] of declared().classes) {
    const value = client[name];
    assert.equal(typeof value, "function", name);
    const actual = Object.getPrototypeOf(value.prototype)?.constructor;
    assert.equal(actual === Object ? null : actual, parent === null ? null : parent === "Error" ? Error : client[parent],
      `${name} extends ${parent}`);
  }
});

test("the client's public methods are the declared ones", () => {
  const own = Object.getOwnPropertyNames(client.ClawmemClient.prototype)
    .filter((name) => name !== "constructor" && !name.startsWith("_")).sort();
  assert.deepEqual(own, declaredMethods("ClawmemClient"));
});
