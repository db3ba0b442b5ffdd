// xgrammar compiled to WebAssembly (@mlc-ai/web-xgrammar): the grammar engine of structured
// outputs. Its package says "type": "module" but ships a UMD bundle that only works as CommonJS
// (as ESM it reaches for `require` and fails), so it is compiled here as a CommonJS module from
// its own file, with its own require and paths. Single-threaded: each grammar thread loads its
// own instance (engine/grammar/thread.ts).
import Module, { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';

export type Xgrammar = typeof import('@mlc-ai/web-xgrammar');

interface CommonJsModule {
  filename: string;
  paths: string[];
  exports: unknown;
  _compile(source: string, filename: string): void;
}

interface ModuleInternals {
  new (id: string): CommonJsModule;
  _nodeModulePaths(directory: string): string[];
}

let loaded: Xgrammar | null = null;

export function loadXgrammar(): Xgrammar {
  if (loaded !== null) return loaded;
  const file = createRequire(import.meta.url).resolve('@mlc-ai/web-xgrammar');
  const internals = Module as unknown as ModuleInternals;
  const commonJs = new internals(file);
  commonJs.filename = file;
  commonJs.paths = internals._nodeModulePaths(path.dirname(file));
  commonJs._compile(readFileSync(file, 'utf8'), file);
  loaded = commonJs.exports as Xgrammar;
  return loaded;
}
