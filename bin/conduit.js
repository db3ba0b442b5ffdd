#!/usr/bin/env node
// The `conduit` command: runs the compiled CLI (dist/, `npm run build`) with plain Node, so no
// TypeScript loader (and no esbuild process) runs beside a gateway or worker. A missing or stale
// dist/ stops here in one line: running yesterday's build of today's sources would be worse.
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const distDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'dist');
/** tsc's record of the build: touched by `npm run build` once it succeeds, it dates the build. */
const buildInfoFile = path.join(distDir, '.tsbuildinfo');

/** True when dist/ was built after every source it was built from was last changed. */
function isBuildCurrent() {
  const builtMs = statSync(buildInfoFile, { throwIfNoEntry: false })?.mtimeMs;
  if (builtMs === undefined) return false;
  // fileNames: every file of the build, relative to dist/; the image ships no sources to compare.
  const { fileNames } = JSON.parse(readFileSync(buildInfoFile, 'utf8'));
  return fileNames.every((file) => {
    if (file.includes('node_modules/')) return true;
    const changedMs = statSync(path.resolve(distDir, file), { throwIfNoEntry: false })?.mtimeMs;
    return changedMs === undefined || changedMs <= builtMs;
  });
}

if (!isBuildCurrent()) {
  console.error('conduit: dist/ is missing or stale; run npm run build');
  process.exit(1);
}
// Stack traces name the .ts sources' lines.
process.setSourceMapsEnabled(true);
const { main } = await import(pathToFileURL(path.join(distDir, 'bin', 'cli.js')).href);
process.exitCode = await main(process.argv.slice(2));
