// Scratch folders and configuration files for tests that start `conduit serve` as a process.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** A folder removed when the test ends. */
export function tempDir(t: { after(fn: () => void): void }): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-lifecycle-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A configuration file (JSON is YAML) in dir. */
export function writeConfig(dir: string, config: object): string {
  const file = path.join(dir, 'conduit.yaml');
  writeFileSync(file, JSON.stringify(config));
  return file;
}
