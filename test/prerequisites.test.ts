// npm test's first step (test/prerequisites.ts) run as npm runs it, on a PATH that lacks the
// system tools: a root with apt-get installs them (here a stand-in apt-get that records its
// calls and puts the programs on PATH), anyone else gets one line naming packages and command.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const isRoot = process.getuid?.() === 0;

/** A directory with node in it and, optionally, a stand-in apt-get that "installs" into it. */
function fakeBin(t: { after(fn: () => void): void }, { withAptGet }: { withAptGet: boolean }) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-prereq-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  symlinkSync(process.execPath, path.join(dir, 'node'));
  const log = path.join(dir, 'apt-get.log');
  if (withAptGet) {
    const script = [
      '#!/bin/sh',
      `echo "$*" >> '${log}'`,
      'if [ "$1" = install ]; then',
      '  for arg in "$@"; do',
      '    case "$arg" in -*|install) ;; *)',
      '      name="$arg"; [ "$arg" = mpich ] && name=mpiexec.mpich',
      `      printf '#!/bin/sh\\n' > '${dir}'/"$name"; /bin/chmod +x '${dir}'/"$name" ;;`,
      '    esac',
      '  done',
      'fi',
    ].join('\n');
    writeFileSync(path.join(dir, 'apt-get'), script);
    chmodSync(path.join(dir, 'apt-get'), 0o755);
  }
  return { dir, aptCalls: () => readFileSync(log, 'utf8').trim().split('\n') };
}

function runCheck(dir: string, env: NodeJS.ProcessEnv = {}) {
  const result = spawnSync(process.execPath, ['--import', 'tsx', 'test/prerequisites.ts'], {
    cwd: repoRoot,
    env: { HOME: process.env.HOME, PATH: dir, ...env },
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(result.error, undefined, `the check did not run: ${result.error}`);
  return result;
}

test('with every tool installed, the check passes silently', (t) => {
  const { dir } = fakeBin(t, { withAptGet: false });
  for (const name of ['redis-server', 'chromium', 'mpiexec.mpich']) symlinkSync('/bin/true', path.join(dir, name));
  const result = runCheck(dir);
  assert.equal(result.status, 0, result.stderr);
  assert.equal(result.stderr + result.stdout, '');
});

test('without apt-get: one line naming the missing packages and how to install them, exit 1', (t) => {
  const { dir } = fakeBin(t, { withAptGet: false });
  const result = runCheck(dir);
  assert.equal(result.status, 1);
  assert.equal(result.stdout, '');
  const lines = result.stderr.trim().split('\n');
  assert.equal(lines.length, 1, result.stderr);
  assert.match(lines[0], /^npm test needs redis-server, chromium and mpich, .*`apt-get install redis-server chromium mpich`/);
  assert.match(lines[0], /CHROMIUM_PATH/);
});

test('CHROMIUM_PATH stands for chromium; only what is still missing is named', (t) => {
  const { dir } = fakeBin(t, { withAptGet: false });
  symlinkSync('/bin/true', path.join(dir, 'mpiexec.mpich'));
  const result = runCheck(dir, { CHROMIUM_PATH: '/bin/true' });
  assert.equal(result.status, 1);
  assert.match(result.stderr, /^npm test needs redis-server, .*`apt-get install redis-server`/);
  assert.doesNotMatch(result.stderr, /chromium/i);
});

test(isRoot ? 'as root with apt-get: updates the lists, installs what is missing, and passes' : 'with apt-get but not root: the line gives the sudo command', (t) => {
  const { dir, aptCalls } = fakeBin(t, { withAptGet: true });
  const result = runCheck(dir);
  if (isRoot) {
    assert.equal(result.status, 0, result.stderr);
    assert.deepEqual(aptCalls(), ['update -q', 'install -y -q --no-install-recommends redis-server chromium mpich']);
  } else {
    assert.equal(result.status, 1);
    assert.match(result.stderr.trim(), /^npm test needs redis-server, chromium and mpich, .*`sudo apt-get install redis-server chromium mpich`[^\n]*$/);
  }
});
