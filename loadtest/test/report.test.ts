// The CLI end to end against the scripted server: results.json fields, a self-contained
// report.html with well-formed inline SVG, a workload written and replayed, and compare.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { main } from '../cli.ts';
import { startScriptedServer } from '../scripted-sse-server.ts';

const STAT_KEYS = ['mean', 'p50', 'p90', 'p95', 'p99'];

/** Tags balance, attributes are quoted, and no number is NaN: what a browser needs to draw the SVG. */
function assertWellFormedSvg(svg: string): void {
  const stack: string[] = [];
  for (const match of svg.matchAll(/<(\/?)([a-z]+)((?:\s+[a-zA-Z0-9-]+="[^"]*")*)\s*(\/?)>/g)) {
    const [, closing, name, , selfClosing] = match;
    if (selfClosing) continue;
    if (closing) assert.equal(stack.pop(), name, `unbalanced </${name}>`);
    else stack.push(name);
  }
  assert.deepEqual(stack, []);
  assert.doesNotMatch(svg, /NaN|Infinity|undefined/);
  const stripped = svg.replace(/<(\/?)([a-z]+)((?:\s+[a-zA-Z0-9-]+="[^"]*")*)\s*(\/?)>/g, '');
  assert.doesNotMatch(stripped, /[<>]/, 'every tag parsed');
}

/** The cells of the summary table's rows (after its two header rows). */
function loadPointRows(html: string): string[][] {
  const table = /<table class="load-points">([\s\S]*?)<\/table>/.exec(html);
  assert.ok(table, 'a table of load points');
  return [...table[1].matchAll(/<tr>([\s\S]*?)<\/tr>/g)]
    .slice(2)
    .map((row) => [...row[1].matchAll(/<td[^>]*>([^<]*)<\/td>/g)].map((cell) => cell[1]));
}

test('a run writes results.json and a self-contained report; a workload file replays; compare puts runs side by side', async (t) => {
  const server = await startScriptedServer({
    tokenizer: true,
    script: (_request, index) =>
      index % 5 === 4
        ? { status: 503, chunks: [] }
        : { chunks: [{ delayMs: 3, text: 'a' }, { delayMs: 1, text: 'b' }, { delayMs: 1, text: 'c' }], usage: { promptTokens: 9, completionTokens: 3, cachedTokens: 3 } },
    recordRequests: false,
  });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'loadtest-'));
  t.mock.method(console, 'log', () => {});
  try {
    const runA = path.join(dir, 'a');
    const workloadFile = path.join(dir, 'w.jsonl');
    assert.equal(
      await main([
        '--url', server.baseUrl, '--model', 'm', '--scenario', 'distribution', '--input-dist', 'uniform:4:12', '--output-dist', 'fixed:3',
        '--requests', '10', '--rate', '200,400', '--goodput', 'ttft:10000,e2e:10000', '--label', 'A <run>', '--quiet', '--out', runA,
        '--write-workload', workloadFile,
      ]),
      0,
    );
    const results = JSON.parse(await readFile(path.join(runA, 'results.json'), 'utf8'));
    for (const key of ['ttft_ms', 'itl_ms', 'tpot_ms', 'e2e_ms']) assert.deepEqual(Object.keys(results[key]).filter((k) => STAT_KEYS.includes(k)), STAT_KEYS);
    assert.equal(typeof results.request_throughput, 'number');
    assert.equal(typeof results.output_token_throughput, 'number');
    assert.equal(results.errors.by_type.http_503, 4);
    assert.equal(results.load_points.length, 2);
    assert.equal(results.prefix_cache_hit_rate, 1 / 3);
    assert.equal(results.goodput.fraction, 16 / 20);

    // Each load point's own summary, as the report's table shows it.
    for (const [i, rate] of [200, 400].entries()) {
      const point = results.load_points[i];
      assert.deepEqual(point.offered_load, { kind: 'rate', requests_per_s: rate });
      assert.equal(point.num_requests, 10);
      for (const key of ['ttft_ms', 'itl_ms', 'e2e_ms']) assert.equal(typeof point[key].p99, 'number', `${key} of point ${i}`);
      assert.equal(typeof point.output_token_throughput, 'number');
    }
    assert.equal(results.load_points[0].errors.total + results.load_points[1].errors.total, 4);

    const html = await readFile(path.join(runA, 'report.html'), 'utf8');
    assert.match(html, /^<!DOCTYPE html>/);
    assert.doesNotMatch(html, /<script|<link|src=|href=|url\(/, 'nothing loads from elsewhere');
    assert.match(html, /A &#60;run&#62;/, 'labels are escaped');
    // One summary row per load point: its load, requests, failures, throughputs, TTFT/ITL/e2e p50, p90, p99.
    const rows = loadPointRows(html);
    assert.equal(rows.length, 2);
    for (const [i, row] of rows.entries()) {
      const point = results.load_points[i];
      assert.deepEqual(row, [
        `${[200, 400][i]} req/s Poisson`, String(point.num_requests), String(point.errors.total),
        point.request_throughput.toFixed(2), point.output_token_throughput.toFixed(1),
        ...['ttft_ms', 'itl_ms', 'e2e_ms'].flatMap((key) => ['p50', 'p90', 'p99'].map((p) => point[key][p].toFixed(1))),
      ]);
    }
    const svgs = html.match(/<svg[\s\S]*?<\/svg>/g) ?? [];
    assert.equal(svgs.length, 9, 'five latency distributions, two timelines, two offered-load charts');
    svgs.forEach(assertWellFormedSvg);
    assert.ok(svgs.every((svg) => /<polyline points="[\d., ]+"/.test(svg)));
    // Distributions and timelines: one line per load point, not one for the pooled sweep.
    for (const svg of svgs.slice(0, 7)) assert.equal(svg.match(/<polyline /g)?.length, 2, svg.slice(0, 120));

    const runB = path.join(dir, 'b');
    assert.equal(await main(['--url', server.baseUrl, '--model', 'm', '--scenario', workloadFile, '--concurrency', '4', '--quiet', '--out', runB]), 0);
    const replayed = JSON.parse(await readFile(path.join(runB, 'results.json'), 'utf8'));
    assert.equal(replayed.num_requests, 10);
    assert.equal(replayed.workload, 'w.jsonl');

    // A sweep beside a single point: a row per point of each run, named by run.
    const compared = path.join(dir, 'compare');
    assert.equal(await main(['compare', path.join(runA, 'results.json'), path.join(runB, 'results.json'), '--out', compared]), 0);
    const comparison = await readFile(path.join(compared, 'report.html'), 'utf8');
    assert.deepEqual(loadPointRows(comparison).map((row) => row.slice(0, 2)), [
      ['A &#60;run&#62;', '200 req/s Poisson'], ['A &#60;run&#62;', '400 req/s Poisson'], [replayed.label, '4 clients'],
    ]);
    (comparison.match(/<svg[\s\S]*?<\/svg>/g) ?? []).forEach(assertWellFormedSvg);

    // Two runs of one point each: the details gain a B-vs-A column.
    const runC = path.join(dir, 'c');
    assert.equal(await main(['--url', server.baseUrl, '--model', 'm', '--scenario', workloadFile, '--concurrency', '2', '--quiet', '--out', runC]), 0);
    const pair = path.join(dir, 'pair');
    assert.equal(await main(['compare', path.join(runB, 'results.json'), path.join(runC, 'results.json'), '--out', pair]), 0);
    assert.match(await readFile(path.join(pair, 'report.html'), 'utf8'), /<th>B vs A<\/th>/);
  } finally {
    await rm(dir, { recursive: true, force: true });
    await server.close();
  }
});
