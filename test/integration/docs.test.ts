// The documentation's examples, run as a reader runs them against what `npm start` serves (the
// compiled `conduit serve` on configs/default.yaml, on free ports, on the scalar kernels: see
// scalarDefaultConfig), their output compared with what the page shows. The markdown is the source: the code blocks are read from the files, so
// an example edited, added or gone is checked as it now stands.
//
// In the files below, a `sh` block of `curl ...` or `node FILE.mjs` commands runs with bash (in
// a scratch folder inside the repository, so that `openai` and `ws` resolve as they do for a
// reader there), and the fenced block right after it, `json` or `text`, is its output: JSON is
// compared as data, text line by line, in both with the fields that differ on every run (`id`,
// `created`, `created_at`) left out. A `js` block that opens with `// NAME.mjs: ...` is that file.
// A `conduit loadtest` command runs too (its figures vary, so only its exit code and files are
// checked). Every `json` or `text` block in these files must be the output of such a command.
// `localhost:8000` in a command or file becomes the server's address.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';
import { startCli } from './cli-process.ts';
import { repoRoot, WAIT_BOUND_MS } from './harness.ts';

/** The documents whose examples are checked, in the order they run. */
export const CHECKED_DOCS = ['README.md', 'models/README.md', 'models/conduit-tiny/README.md', 'models/digits_pipeline/README.md'];
/** Fields whose values differ on every run. */
const VARYING_FIELDS = new Set(['id', 'created', 'created_at']);
const COMMAND_TIMEOUT_MS = 60_000;

export interface CodeBlock {
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  lang: string;
  text: string;
}

/** Every fenced block of a markdown text, in order. */
export function codeBlocks(file: string, markdown: string): CodeBlock[] {
  const blocks: CodeBlock[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\S*)\s*$/.exec(lines[i]);
    if (open === null) continue;
    const end = lines.findIndex((line, j) => j > i && line.startsWith('```'));
    assert.ok(end !== -1, `${file}:${i + 1}: a code block never closed`);
    blocks.push({ file, line: i + 1, lang: open[1], text: lines.slice(i + 1, end).join('\n') });
    i = end;
  }
  return blocks;
}

type Example =
  | { kind: 'file'; block: CodeBlock; name: string }
  | { kind: 'command'; block: CodeBlock; output: CodeBlock | null; isLoadtest: boolean };

const OUTPUT_LANGS = new Set(['json', 'text']);

/** The runnable examples of one document, each command paired with the output block after it. */
export function examplesOf(blocks: readonly CodeBlock[]): Example[] {
  const examples: Example[] = [];
  for (let i = 0; i < blocks.length; i++) {
    const block = blocks[i];
    const where = `${block.file}:${block.line}`;
    const fileName = /^\/\/ (\S+\.mjs):/.exec(block.text)?.[1];
    if ((block.lang === 'js' || block.lang === 'javascript') && fileName !== undefined) {
      examples.push({ kind: 'file', block, name: fileName });
      continue;
    }
    if (OUTPUT_LANGS.has(block.lang)) assert.fail(`${where}: a ${block.lang} sample that no command before it produces`);
    if (block.lang !== 'sh') continue;
    const firstWords = block.text.trim().split(/\s+/).slice(0, 3).join(' ');
    const isLoadtest = /^(node bin\/conduit\.js|npx conduit|conduit) loadtest/.test(firstWords);
    if (!/^(curl|node \S+\.mjs)/.test(firstWords) && !isLoadtest) continue;
    const next = blocks[i + 1];
    const output = next !== undefined && OUTPUT_LANGS.has(next.lang) ? next : null;
    if (output !== null) i++;
    assert.ok(output !== null || isLoadtest, `${where}: an example with no output shown after it`);
    examples.push({ kind: 'command', block, output, isLoadtest });
  }
  return examples;
}

/** The value with every varying field left out, at any depth. */
function withoutVaryingFields(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutVaryingFields);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(Object.entries(value).filter(([key]) => !VARYING_FIELDS.has(key)).map(([key, field]) => [key, withoutVaryingFields(field)]));
}

/** Text with the varying fields of any JSON in it blanked, and trailing spaces and lines dropped. */
function normalizedText(text: string): string {
  return text
    .replace(/"(id|created|created_at)":\s*("[^"]*"|\d+)/g, '"$1":…')
    .split('\n')
    .map((line) => line.trimEnd())
    .join('\n')
    .trimEnd();
}

function compareOutput(output: CodeBlock, actual: string) {
  const where = `${output.file}:${output.line}`;
  if (output.lang === 'json') {
    let parsed: unknown;
    try {
      parsed = JSON.parse(actual);
    } catch {
      assert.fail(`${where}: the command printed no JSON:\n${actual}`);
    }
    assert.deepEqual(withoutVaryingFields(parsed), withoutVaryingFields(JSON.parse(output.text)), `${where}: the server now answers\n${actual}`);
  } else {
    assert.equal(normalizedText(actual), normalizedText(output.text), `${where}: the command now prints\n${actual}`);
  }
}

test('the block reader pairs commands with their output and refuses an output no command produces', () => {
  const markdown = [
    '```js', '// a.mjs: a file', 'console.log(1);', '```',
    '```sh', 'node a.mjs', '```', 'prose', '```text', '1', '```',
    '```sh', 'npm install', '```',
    '```sh', 'node bin/conduit.js loadtest --url http://localhost:8000', '```',
  ].join('\n');
  const examples = examplesOf(codeBlocks('x.md', markdown));
  assert.deepEqual(examples.map((example) => example.kind === 'file' ? `file ${example.name}` : `run ${example.block.line} -> ${example.output?.line ?? 'none'}`), [
    'file a.mjs', 'run 5 -> 9', 'run 15 -> none',
  ]);
  assert.throws(() => examplesOf(codeBlocks('x.md', '```json\n{}\n```')), /x\.md:1: a json sample that no command before it produces/);
  assert.throws(() => examplesOf(codeBlocks('x.md', '```sh\ncurl -s localhost:8000/health\n```')), /x\.md:1: an example with no output shown after it/);
});

/**
 * configs/default.yaml with every model on the scalar kernels, its paths made absolute. Kernel
 * paths sum in different orders (AVX-512 in 16 lanes, AVX2 in 8, as the scalar code), so a
 * seeded sample's words part ways between them after a few tokens; the scalar kernels run on
 * every CPU (and agree with AVX2 on these samples), so the docs show their text.
 */
function scalarDefaultConfig(dir: string): string {
  const configDir = path.join(repoRoot, 'configs');
  const config = parseYaml(readFileSync(path.join(configDir, 'default.yaml'), 'utf8'));
  for (const model of config.models) Object.assign(model, { path: path.resolve(configDir, model.path), kernel: 'scalar' });
  if (config.model_repository !== undefined) config.model_repository.path = path.resolve(configDir, config.model_repository.path);
  const file = path.join(dir, 'default-scalar.yaml');
  writeFileSync(file, stringifyYaml(config));
  return file;
}

test("every example in the checked docs runs against npm start's server and prints what the docs show", { timeout: 600_000 }, async (t) => {
  // Inside the repository, so that the examples' imports resolve from its node_modules.
  const scratchDir = mkdtempSync(path.join(repoRoot, '.docs-test-'));
  t.after(() => rmSync(scratchDir, { recursive: true, force: true }));
  const server = startCli(t, ['serve', '--config', scalarDefaultConfig(scratchDir), '--http-port', '0', '--metrics-port', '0', '--grpc-port', '0']);
  const { http } = await server.serving();
  const address = http.replace(/^http:\/\//, '');
  const localize = (text: string) => text.replaceAll('localhost:8000', address).replaceAll('node bin/conduit.js', `node ${path.join(repoRoot, 'bin', 'conduit.js')}`);
  let numChecked = 0;
  for (const doc of CHECKED_DOCS) {
    for (const example of examplesOf(codeBlocks(doc, readFileSync(path.join(repoRoot, doc), 'utf8')))) {
      const where = `${doc}:${example.block.line}`;
      if (example.kind === 'file') {
        writeFileSync(path.join(scratchDir, example.name), localize(example.block.text));
        continue;
      }
      const result = spawnSync('bash', ['-euo', 'pipefail', '-c', localize(example.block.text)], {
        cwd: scratchDir, encoding: 'utf8', timeout: Math.min(COMMAND_TIMEOUT_MS, WAIT_BOUND_MS * 2),
      });
      assert.equal(result.error, undefined, `${where}: ${result.error}`);
      assert.equal(result.status, 0, `${where}: exit code ${result.status}\n${result.stdout}\n${result.stderr}`);
      if (example.isLoadtest) {
        const outDir = /--out (\S+)/.exec(example.block.text)?.[1];
        assert.ok(outDir !== undefined, `${where}: a load test that writes no report`);
        for (const file of ['results.json', 'report.html']) assert.ok(existsSync(path.join(scratchDir, outDir, file)), `${where}: no ${outDir}/${file}`);
        assert.equal(JSON.parse(readFileSync(path.join(scratchDir, outDir, 'results.json'), 'utf8')).errors.total, 0, `${where}: failed requests`);
      } else {
        compareOutput(example.output!, result.stdout);
      }
      numChecked++;
    }
  }
  t.diagnostic(`${numChecked} examples checked`);
  assert.ok(numChecked >= 6, `only ${numChecked} examples found: the docs lost theirs, or the reader broke`);
});
