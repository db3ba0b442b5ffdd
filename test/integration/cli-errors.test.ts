// The `conduit` command's answers to a user who asks for help or points it at the wrong place:
// usage on --help for every command, the version, and a start that cannot succeed told in one
// fatal JSON line with no stack (a model folder missing, not a folder, without a tokenizer or
// without weights), as processes, the way a user runs them.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { defaultModelDir, repoRoot, within } from './harness.ts';
import { groupEmptied, startCli } from './cli-process.ts';

test('--help on every command prints its usage on stdout with exit code 0; --version prints the version', async (t) => {
  const commands: [args: string[], usage: RegExp][] = [
    [['--help'], /^usage: conduit serve\|worker\|rank\|loadtest/],
    [['serve', '--help'], /^usage: conduit serve \[--config FILE\]/],
    [['worker', '-h'], /^usage: conduit worker --model DIR --listen/],
    [['loadtest', '--help'], /^usage:\n {2}conduit loadtest --url URL/],
    [['loadtest', 'kserve', '--help'], /^usage: conduit loadtest kserve --url URL/],
  ];
  // All at once: each is a process start, and they are independent.
  await Promise.all(commands.map(async ([args, usage]) => {
    const cli = startCli(t, args);
    assert.equal(await within(cli.exited, `conduit ${args.join(' ')} to exit`), 0, args.join(' '));
    assert.match(cli.stdoutLines().join('\n'), usage, args.join(' '));
    assert.equal(cli.stderr(), '', args.join(' '));
  }));
  const version = startCli(t, ['--version']);
  assert.equal(await within(version.exited, 'conduit --version to exit'), 0);
  assert.deepEqual(version.stdoutLines(), [JSON.parse(readFileSync(path.join(repoRoot, 'package.json'), 'utf8')).version]);
  const unknownFlag = startCli(t, ['serve', '--no-such-flag']);
  assert.equal(await within(unknownFlag.exited, 'exit on an unknown flag'), 2);
  assert.match(unknownFlag.stderr(), /^conduit: Unknown option '--no-such-flag'.*\(conduit serve --help lists the options\)\n$/);
});

/** Runs `conduit serve --model modelDir` to its end; its output must be one fatal JSON line saying what is wrong. */
async function oneFatalLine(t: TestContext, modelDir: string): Promise<string> {
  const server = startCli(t, ['serve', '--model', modelDir, '--http-port', '0', '--metrics-port', '0']);
  assert.equal(await within(server.exited, `conduit serve --model ${modelDir} to exit`), 1);
  assert.equal(server.stderr(), '', 'nothing outside the JSON log');
  const lines = server.stdoutLines();
  const entries = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
  const fatal = entries.filter((entry) => entry.level === 'fatal');
  assert.equal(fatal.length, 1, lines.join('\n'));
  assert.deepEqual({ event: fatal[0].event, exit_code: fatal[0].exit_code, err: fatal[0].err }, { event: 'fatal', exit_code: 1, err: undefined });
  assert.doesNotMatch(lines.join('\n'), /\n\s+at /, 'no stack');
  await within(groupEmptied(server.pid), 'the process group to empty');
  return fatal[0].msg as string;
}

test('a model directory that does not exist, is not a directory, or holds no weights: one fatal line saying so, exit code 1, no stack', { timeout: 120_000 }, async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cli-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  assert.equal(await oneFatalLine(t, path.join(workDir, 'no-such-dir')), `model no-such-dir: the directory ${path.join(workDir, 'no-such-dir')} does not exist`);
  writeFileSync(path.join(workDir, 'a-file'), '');
  assert.equal(await oneFatalLine(t, path.join(workDir, 'a-file')), `model a-file: ${path.join(workDir, 'a-file')} is not a directory`);
  const noTokenizer = path.join(workDir, 'no-tokenizer');
  mkdirSync(noTokenizer);
  assert.match(await oneFatalLine(t, noTokenizer), /^model no-tokenizer: .*no-tokenizer: no tokenizer found/);
  // A checkpoint folder without its weights: the gateway reads its tokenizer, the worker cannot load it.
  const noWeights = path.join(workDir, 'no-weights');
  mkdirSync(noWeights);
  for (const file of ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']) {
    copyFileSync(path.join(defaultModelDir, file), path.join(noWeights, file));
  }
  assert.equal(
    await oneFatalLine(t, noWeights),
    `worker 0-0 cannot start: ${noWeights}: neither model.safetensors nor model.safetensors.index.json exists`,
  );
});

test('conduit worker alone on a checkpoint it cannot load: one fatal line of its own, exit code 1', { timeout: 120_000 }, async (t) => {
  const workDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cli-'));
  t.after(() => rmSync(workDir, { recursive: true, force: true }));
  const worker = startCli(t, ['worker', '--model', workDir, '--listen', '127.0.0.1:0']);
  assert.equal(await within(worker.exited, 'the worker to exit'), 1);
  assert.equal(worker.stderr(), '');
  const entries = worker.stdoutLines().map((line) => JSON.parse(line) as Record<string, unknown>);
  assert.equal(entries.length, 1);
  assert.deepEqual({ level: entries[0].level, role: entries[0].role, event: entries[0].event }, { level: 'fatal', role: 'worker', event: 'fatal' });
  assert.match(entries[0].msg as string, /^worker cannot start: /);
});
