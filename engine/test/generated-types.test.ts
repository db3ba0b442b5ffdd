// engine/grpc/generated/ is what `npm run gen:proto` makes of proto/engine.proto: regenerated
// here into a scratch directory, it must match what is committed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const committedDir = path.join(repoRoot, 'engine', 'grpc', 'generated');

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => path.relative(dir, path.join(entry.parentPath, entry.name)))
    .sort();
}

test('the committed wire types are what proto/engine.proto generates', { timeout: 60_000 }, () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'conduit-gen-'));
  try {
    const script = JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')).scripts['gen:proto'] as string;
    const args = script.split(' ').slice(1).map((arg) => (arg.startsWith('--outDir=') ? `--outDir=${scratch}` : arg));
    execFileSync(path.join(repoRoot, 'node_modules', '.bin', 'proto-loader-gen-types'), args, { cwd: repoRoot });
    const files = filesUnder(scratch);
    assert.deepEqual(filesUnder(committedDir), files, 'run npm run gen:proto');
    for (const file of files) {
      assert.equal(readFileSync(path.join(committedDir, file), 'utf8'), readFileSync(path.join(scratch, file), 'utf8'), `${file}: run npm run gen:proto`);
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
});
