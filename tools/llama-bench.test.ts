// The side-by-side's llama-bench call and its pairing of rounds, against a stand-in llama-bench
// (a script that records its arguments and prints llama-bench's JSON), so it runs without llama.cpp.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pairedRatios, runLlamaBench } from './llama-bench.ts';

/** A llama-bench stand-in printing rows (llama-bench's -o json shape) and writing its argv to args.txt. */
function fakeLlamaBench(dir: string, rows: object[]): string {
  const bin = path.join(dir, 'llama-bench');
  writeFileSync(bin, `#!/bin/sh\necho "$@" > "${path.join(dir, 'args.txt')}"\necho 'llama_model_load: noise on stderr' >&2\ncat <<'EOF'\n${JSON.stringify(rows, null, 2)}\nEOF\n`);
  chmodSync(bin, 0o755);
  return bin;
}

test('runLlamaBench: one repetition of pp and tg on the file and threads given; the matching rows\' tok/s', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-llama-bench-'));
  try {
    const bin = fakeLlamaBench(dir, [
      { n_prompt: 512, n_gen: 0, n_depth: 0, avg_ts: 812.5, samples_ts: [812.5] },
      { n_prompt: 0, n_gen: 128, n_depth: 0, avg_ts: 301.25, samples_ts: [301.25] },
    ]);
    assert.deepEqual(runLlamaBench(bin, '/x/model.gguf', { promptTokens: 512, genTokens: 128, numThreads: 2 }), { pp: 812.5, tg: 301.25 });
    assert.equal(readFileSync(path.join(dir, 'args.txt'), 'utf8').trim(), '-m /x/model.gguf -p 512 -n 128 -t 2 -r 1 -o json');
    // Rows of other sizes are not the figures asked for.
    const wrong = fakeLlamaBench(dir, [{ n_prompt: 256, n_gen: 0, avg_ts: 1 }, { n_prompt: 0, n_gen: 128, avg_ts: 2 }]);
    assert.throws(() => runLlamaBench(wrong, '/x/model.gguf', { promptTokens: 512, genTokens: 128, numThreads: 2 }), /no pp512 and tg128 rows/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('pairedRatios: each round against the same round, not medians against medians', () => {
  // Round 2 ran faster for both, and llama.cpp's round 3 met a slow minute: the median of the
  // pairs says 1.1x, where the ratio of the two medians (330 / 200) would say 1.65x.
  const ours = [220, 330, 400];
  const theirs = [200, 300, 200];
  const { perRound, median: ratio } = pairedRatios(ours, theirs);
  assert.deepEqual(perRound.map((r) => r.toFixed(6)), ['1.100000', '1.100000', '2.000000']);
  assert.ok(Math.abs(ratio - 1.1) < 1e-12);
  assert.throws(() => pairedRatios([1, 2], [1]), /differ in number/);
  assert.throws(() => pairedRatios([], []), /differ in number/);
});
