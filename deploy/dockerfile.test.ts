// The Dockerfile, checked without a Docker engine (none runs on our machines): what each COPY
// names exists where it will be copied from, the compiled code needs no development dependency
// (the image prunes them), and the runtime stage, laid out as its COPY lines lay it out, serves
// by its own ENTRYPOINT and CMD with no TypeScript source beside it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { builtinModules } from 'node:module';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startCli } from '../test/integration/cli-process.ts';
import { pollUntil, within } from '../test/wait.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
/** The Dockerfile's WORKDIR in both stages. */
const IMAGE_APP_DIR = '/app';

interface CopyStep {
  /** The stage it copies from; null: the build context (the repository). */
  fromStage: string | null;
  sources: string[];
  destination: string;
}

interface Stage {
  name: string;
  copies: CopyStep[];
  instructions: Map<string, string>;
}

function parseDockerfile(text: string): Stage[] {
  const stages: Stage[] = [];
  for (const line of text.replace(/\\\n/g, ' ').split('\n')) {
    const [instruction, ...words] = line.trim().split(/\s+/);
    if (instruction === 'FROM') {
      stages.push({ name: words[2] ?? `stage ${stages.length}`, copies: [], instructions: new Map() });
    } else if (instruction === 'COPY') {
      const fromStage = words.find((word) => word.startsWith('--from='))?.slice('--from='.length) ?? null;
      const paths = words.filter((word) => !word.startsWith('--'));
      stages.at(-1)!.copies.push({ fromStage, sources: paths.slice(0, -1), destination: paths.at(-1)! });
    } else if (instruction !== undefined && /^[A-Z]+$/.test(instruction)) {
      stages.at(-1)?.instructions.set(instruction, words.join(' '));
    }
  }
  return stages;
}

const stages = parseDockerfile(readFileSync(path.join(repoRoot, 'Dockerfile'), 'utf8'));
const runtimeStage = stages.at(-1)!;
const ignoredByDocker = readFileSync(path.join(repoRoot, '.dockerignore'), 'utf8').split('\n').filter((line) => line !== '' && !line.startsWith('#'));

/** A COPY source's files: its path, or the matches of a `*` in its last segment. */
function expand(source: string): string[] {
  if (!path.basename(source).includes('*')) return [source];
  const pattern = new RegExp(`^${path.basename(source).split('*').map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`);
  return readdirSync(path.join(repoRoot, path.dirname(source))).filter((name) => pattern.test(name)).map((name) => path.join(path.dirname(source), name));
}

/** Where a COPY source is on this machine: the repository for the context, the checkout's own build for the build stage. */
function localPath(step: CopyStep, source: string): string {
  return step.fromStage === null ? path.join(repoRoot, source) : path.join(repoRoot, path.relative(IMAGE_APP_DIR, source));
}

test('the image is built in two stages, runs as a user other than root, and checks its health', () => {
  assert.equal(stages.length, 2);
  assert.equal(runtimeStage.instructions.get('USER'), 'node');
  assert.match(runtimeStage.instructions.get('HEALTHCHECK') ?? '', /\/health/);
  assert.ok(runtimeStage.copies.some((step) => step.fromStage === stages[0].name && step.sources.includes(`${IMAGE_APP_DIR}/dist`)), 'the runtime copies dist/');
});

test('every COPY from the build context names files the context holds', () => {
  for (const step of stages.flatMap((stage) => stage.copies).filter((candidate) => candidate.fromStage === null)) {
    for (const source of step.sources) {
      const files = expand(source);
      assert.ok(files.length > 0 && files.every((file) => existsSync(path.join(repoRoot, file))), `COPY ${source}: not in the repository`);
      assert.ok(!ignoredByDocker.includes(source.split('/')[0]), `COPY ${source}: .dockerignore leaves it out of the context`);
    }
  }
});

test('every COPY from the build stage names what npm install builds here', () => {
  for (const step of runtimeStage.copies.filter((candidate) => candidate.fromStage !== null)) {
    assert.equal(step.fromStage, stages[0].name);
    for (const source of step.sources) assert.ok(existsSync(localPath(step, source)), `COPY --from=${step.fromStage} ${source}: npm install builds no ${path.relative(IMAGE_APP_DIR, source)}`);
  }
});

test('the compiled code imports only Node built-ins and runtime dependencies, which npm prune --omit=dev keeps', () => {
  const { dependencies } = JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
  const files = readdirSync(path.join(repoRoot, 'dist'), { recursive: true, encoding: 'utf8' }).filter((file) => file.endsWith('.js'));
  assert.ok(files.length > 50, `dist/ holds ${files.length} modules: run npm run build`);
  const imported = new Set<string>();
  for (const file of files) {
    const code = readFileSync(path.join(repoRoot, 'dist', file), 'utf8');
    // Static imports and re-exports (tsc starts each on a line of its own), then import('name').
    const specifiers = [
      ...code.matchAll(/^(?:import|export)\b[^;=(){}]*(?:\{[^;=()}]*\}[^;=(){}]*)?['"]([^'"]+)['"];$/gm),
      ...code.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
    ].map((match) => match[1]);
    for (const specifier of specifiers.filter((candidate) => !candidate.startsWith('.'))) {
      // A package name is its first segment, or its first two for a scope.
      imported.add(specifier.split('/').slice(0, specifier.startsWith('@') ? 2 : 1).join('/'));
    }
  }
  const outside = [...imported].filter((name) => !name.startsWith('node:') && !builtinModules.includes(name) && !(name in dependencies));
  assert.deepEqual(outside, [], 'imported by dist/ but not a runtime dependency');
});

test('the runtime stage, laid out by its COPY lines, serves by its ENTRYPOINT and CMD with no sources', { timeout: 120_000 }, async (t) => {
  const imageDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-image-'));
  t.after(() => rmSync(imageDir, { recursive: true, force: true }));
  for (const step of runtimeStage.copies) {
    for (const source of step.fromStage === null ? step.sources.flatMap(expand) : step.sources) {
      const destination = step.destination.endsWith('/') ? path.join(imageDir, step.destination, path.basename(source)) : path.join(imageDir, step.destination);
      mkdirSync(path.dirname(destination), { recursive: true });
      // node_modules, hundreds of megabytes, is linked rather than copied (dependencies' pruning is the test above).
      if (source === `${IMAGE_APP_DIR}/node_modules`) symlinkSync(localPath(step, source), destination);
      else cpSync(localPath(step, source), destination, { recursive: true });
    }
  }
  const sources = readdirSync(imageDir, { recursive: true, encoding: 'utf8' }).filter((file) => file.endsWith('.ts') && !file.startsWith('models/') && !file.startsWith('node_modules/'));
  assert.deepEqual(sources, [], 'the image holds no TypeScript of ours (models/ holds users\' script models)');

  const command = [...JSON.parse(runtimeStage.instructions.get('ENTRYPOINT')!), ...JSON.parse(runtimeStage.instructions.get('CMD')!)] as string[];
  assert.equal(command[0], 'node');
  const server = startCli(t, ['--http-port', '0', '--metrics-port', '0', '--grpc-port', '0'], { command: [process.execPath, ...command.slice(1)], cwd: imageDir });
  const { http: httpAddress } = await server.serving();
  await pollUntil(async () => (await fetch(`${httpAddress}/health`)).ok, 'healthy');
  assert.equal((await fetch(`${httpAddress}/`)).status, 200, 'the chat page');
  const models = (await (await fetch(`${httpAddress}/v2/repository/index`, { method: 'POST' })).json()) as { name: string; state: string }[];
  assert.ok(models.length > 0 && models.every((model) => model.state === 'READY'), JSON.stringify(models));
  server.child.kill('SIGTERM');
  assert.equal(await within(server.exited, 'exit after SIGTERM'), 0);
});
