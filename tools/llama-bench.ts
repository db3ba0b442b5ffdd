// llama.cpp's llama-bench as a benchmark's side-by-side: one repetition of pp512 and tg128 per
// call, so a bench can run it between its own rounds and pair each of its rounds with the
// llama.cpp figures of the same minutes (a host whose memory bandwidth moves by tens of percent
// within minutes makes a ratio between runs minutes apart a ratio between two machines).
import { execFileSync } from 'node:child_process';
import { median } from '../loadtest/stats.ts';

export interface LlamaBenchFigures {
  /** tok/s of pp<promptTokens>: a prompt of that many tokens in one batch. */
  pp: number;
  /** tok/s of tg<genTokens>: that many tokens decoded at batch 1 from an empty context. */
  tg: number;
}

export interface LlamaBenchRun {
  promptTokens: number;
  genTokens: number;
  numThreads: number;
}

/** One llama-bench repetition of pp and tg on file (llama-bench warms each test up first). */
export function runLlamaBench(llamaBin: string, file: string, { promptTokens, genTokens, numThreads }: LlamaBenchRun): LlamaBenchFigures {
  const output = execFileSync(llamaBin, ['-m', file, '-p', String(promptTokens), '-n', String(genTokens), '-t', String(numThreads), '-r', '1', '-o', 'json'], {
    encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], maxBuffer: 1 << 26,
  });
  const rows = JSON.parse(output) as Array<{ n_prompt: number; n_gen: number; avg_ts: number }>;
  const pp = rows.find((row) => row.n_prompt === promptTokens && row.n_gen === 0);
  const tg = rows.find((row) => row.n_gen === genTokens && row.n_prompt === 0);
  if (pp === undefined || tg === undefined) throw new Error(`llama-bench printed no pp${promptTokens} and tg${genTokens} rows: ${output.slice(0, 200)}`);
  return { pp: pp.avg_ts, tg: tg.avg_ts };
}

/** ours[i] / theirs[i] for each round i (same-minute pairs) and their median. */
export function pairedRatios(ours: readonly number[], theirs: readonly number[]): { perRound: number[]; median: number } {
  if (ours.length !== theirs.length || ours.length === 0) throw new Error(`paired rounds differ in number: ${ours.length} vs ${theirs.length}`);
  const perRound = ours.map((rate, round) => rate / theirs[round]);
  return { perRound, median: median(perRound) };
}
