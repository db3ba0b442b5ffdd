// report.html: one self-contained page (inline CSS and SVG, no scripts, no network) for one
// results file, or for several side by side.

import type { LoadPointMetrics } from './metrics.ts';
import type { Results } from './results.ts';
import type { Summary } from './stats.ts';
import { type Series, escapeXml, renderLineChart } from './svg-chart.ts';

const COLORS = ['#1f6fb4', '#e07b1a', '#2a9d4b', '#b03a8c'];

const STYLE = `
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1b1f24; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: 8px 0; } th, td { padding: 3px 10px; border-bottom: 1px solid #eaeef2; text-align: right; }
th:first-child, td:first-child, .details td { text-align: left; } .muted { color: #57606a; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg { background: #fff; border: 1px solid #eaeef2; }
svg .grid { stroke: #eaeef2; } svg .frame { fill: none; stroke: #8c959f; }
svg text { font: 11px system-ui, sans-serif; fill: #1b1f24; } svg .chart-title { font-size: 13px; font-weight: 600; }
svg .axis-label { fill: #57606a; } svg .empty { fill: #8c959f; }
`;

const LATENCIES = [
  ['ttft_ms', 'Time to first token'],
  ['itl_ms', 'Inter-token latency'],
  ['tpot_ms', 'Time per output token'],
  ['e2e_ms', 'End-to-end latency'],
  ['chunk_gap_ms', 'Gap between chunks'],
] as const;

const STATS = ['mean', 'p50', 'p90', 'p95', 'p99'] as const;

function format(value: number | null | undefined, digits = 1): string {
  return value === null || value === undefined || !Number.isFinite(value) ? '–' : value.toFixed(digits);
}

function deltaCell(base: number, other: number): string {
  if (!Number.isFinite(base) || !Number.isFinite(other) || base === 0) return '<td>–</td>';
  const percent = ((other - base) / base) * 100;
  return `<td>${percent >= 0 ? '+' : ''}${percent.toFixed(1)}%</td>`;
}

function summaryTable(runs: readonly Results[]): string {
  const header = `<tr><th>metric</th>${runs.map((run, i) => `<th style="color:${COLORS[i % COLORS.length]}">${escapeXml(run.label)}</th>`).join('')}${runs.length === 2 ? '<th>B vs A</th>' : ''}</tr>`;
  const rows: string[] = [];
  const row = (name: string, values: number[], digits = 1) => {
    const cells = values.map((value) => `<td>${format(value, digits)}</td>`).join('');
    rows.push(`<tr><td>${escapeXml(name)}</td>${cells}${runs.length === 2 ? deltaCell(values[0], values[1]) : ''}</tr>`);
  };
  for (const [key, name] of LATENCIES) {
    for (const stat of STATS) row(`${name} ${stat} (ms)`, runs.map((run) => (run[key] as Summary)[stat]), 2);
  }
  row('request throughput (req/s)', runs.map((run) => run.request_throughput), 2);
  row('output token throughput (tok/s)', runs.map((run) => run.output_token_throughput));
  row('input token throughput (tok/s)', runs.map((run) => run.input_token_throughput));
  if (runs.some((run) => run.goodput)) {
    row('goodput (req/s within targets)', runs.map((run) => run.goodput?.request_throughput ?? NaN), 2);
    row('share of requests within targets (%)', runs.map((run) => (run.goodput?.fraction ?? NaN) * 100));
  }
  row('prefix cache hit rate (%)', runs.map((run) => (run.prefix_cache_hit_rate ?? NaN) * 100));
  row('input tokens mean', runs.map((run) => run.input_tokens.mean));
  row('output tokens mean', runs.map((run) => run.output_tokens.mean));
  row('requests', runs.map((run) => run.num_requests), 0);
  row('failed requests', runs.map((run) => run.errors.total), 0);
  row('duration (s)', runs.map((run) => run.duration_s), 2);
  return `<table>${header}${rows.join('')}</table>`;
}

function runDetails(runs: readonly Results[]): string {
  const fields: [string, (run: Results) => string][] = [
    ['server', (run) => run.url],
    ['model', (run) => run.model],
    ['endpoint', (run) => `${run.endpoint} over ${run.transport}`],
    ['workload', (run) => `${run.workload} (seed ${run.seed})`],
    ['load', (run) => run.load_points.map((point) => describeOfferedLoad(point)).join(', ')],
    ['prompt lengths', (run) => run.prompt_lengths],
    ['output tokens counted from', (run) => Object.entries(run.output_tokens_source).map(([source, n]) => `${source} (${n})`).join(', ') || '–'],
    ['started', (run) => run.started_at],
  ];
  const rows = fields.map(([name, value]) => `<tr><td>${name}</td>${runs.map((run) => `<td>${escapeXml(value(run))}</td>`).join('')}</tr>`);
  return `<table class="muted details">${rows.join('')}</table>`;
}

function describeOfferedLoad(point: LoadPointMetrics): string {
  const offered = point.offered_load;
  switch (offered.kind) {
    case 'rate':
      return `${offered.requests_per_s} req/s Poisson`;
    case 'concurrency':
      return `${offered.clients} clients`;
    case 'trace':
      return 'trace replay';
    case 'sweep':
      return `sweep of ${offered.num_points}`;
  }
}

function latencyCharts(runs: readonly Results[]): string {
  return LATENCIES.map(([key, name]) =>
    renderLineChart({
      title: `${name}: cumulative distribution`,
      xLabel: `${name} (ms)`,
      yLabel: 'percentile',
      series: runs.map((run, i) => ({
        name: run.label,
        color: COLORS[i % COLORS.length],
        points: run.curves[key].map((value, q) => [value, q] as const),
      })),
    }),
  ).join('');
}

function timelineCharts(runs: readonly Results[]): string {
  const timelineSeries = (pick: (run: Results) => number[]) =>
    runs.map((run, i): Series => ({
      name: run.label,
      color: COLORS[i % COLORS.length],
      points: pick(run).map((value, bucket) => [(bucket + 0.5) * run.timeline.bucket_s, value / run.timeline.bucket_s] as const),
    }));
  return (
    renderLineChart({
      title: 'Output token throughput over time',
      xLabel: 'time since start (s)',
      yLabel: 'output tokens/s',
      series: timelineSeries((run) => run.timeline.output_tokens),
    }) +
    renderLineChart({
      title: 'Completed requests over time',
      xLabel: 'time since start (s)',
      yLabel: 'requests/s',
      series: timelineSeries((run) => run.timeline.requests_completed),
    })
  );
}

function offeredLoadValue(point: LoadPointMetrics): number {
  const offered = point.offered_load;
  return offered.kind === 'rate' ? offered.requests_per_s : offered.kind === 'concurrency' ? offered.clients : NaN;
}

function offeredLoadCharts(runs: readonly Results[]): string {
  const axisKind = runs.map((run) => run.load_points[0].offered_load.kind).find((kind) => kind === 'rate' || kind === 'concurrency');
  if (!axisKind) return '<p class="muted">A trace replay has no offered-load axis.</p>';
  // Rates and client counts do not share an axis: runs of the other kind are left out here.
  const swept = runs.filter((run) => run.load_points[0].offered_load.kind === axisKind);
  const xLabel = axisKind === 'rate' ? 'offered load (req/s)' : 'concurrent clients';
  const series = (pick: (point: LoadPointMetrics) => number, suffix: string, dashed: boolean) =>
    swept.map((run): Series => ({
      name: `${run.label} ${suffix}`.trim(),
      color: COLORS[runs.indexOf(run) % COLORS.length],
      dashed,
      points: run.load_points.map((point) => [offeredLoadValue(point), pick(point)] as const),
    }));
  return (
    renderLineChart({
      title: 'TTFT against offered load',
      xLabel,
      yLabel: 'TTFT (ms)',
      markers: true,
      series: [...series((p) => p.ttft_ms.p50, 'p50', false), ...series((p) => p.ttft_ms.p99, 'p99', true)],
    }) +
    renderLineChart({
      title: 'Throughput against offered load',
      xLabel,
      yLabel: 'output tokens/s',
      markers: true,
      series: series((p) => p.output_token_throughput, '', false),
    })
  );
}

function errorTable(runs: readonly Results[]): string {
  const types = [...new Set(runs.flatMap((run) => Object.keys(run.errors.by_type)))].sort();
  if (types.length === 0) return '<p>No failed requests.</p>';
  const rows = types.map((type) => {
    const counts = runs.map((run) => `<td>${run.errors.by_type[type] ?? 0}</td>`).join('');
    const example = runs.map((run) => run.errors.examples[type]).find((message) => message) ?? '';
    return `<tr><td>${escapeXml(type)}</td>${counts}<td style="text-align:left" class="muted">${escapeXml(example)}</td></tr>`;
  });
  return `<table><tr><th>error</th>${runs.map((run) => `<th>${escapeXml(run.label)}</th>`).join('')}<th style="text-align:left">first message</th></tr>${rows.join('')}</table>`;
}

export function renderReport(runs: readonly Results[]): string {
  const title = runs.length === 1 ? `Load test: ${runs[0].label}` : `Load test comparison: ${runs.map((run) => run.label).join(' vs ')}`;
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeXml(title)}</title><style>${STYLE}</style></head>
<body>
<h1>${escapeXml(title)}</h1>
${runDetails(runs)}
<h2>Summary</h2>
<p class="muted">Latencies over successful requests; percentiles by linear interpolation (numpy's default, as genai-perf). ITL = (e2e − TTFT) / (output tokens − 1); TPOT = e2e / output tokens.</p>
${summaryTable(runs)}
<h2>Latency distributions</h2>
<div class="charts">${latencyCharts(runs)}</div>
<h2>Throughput over time</h2>
<div class="charts">${timelineCharts(runs)}</div>
<h2>Against offered load</h2>
<div class="charts">${offeredLoadCharts(runs)}</div>
<h2>Errors</h2>
${errorTable(runs)}
</body></html>
`;
}
