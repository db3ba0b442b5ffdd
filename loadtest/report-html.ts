// report.html: one self-contained page (inline CSS and SVG, no scripts, no network) for one
// results file, or for several side by side. A sweep is read load point by load point, as
// genai-perf and perf_analyzer report it: one summary row per point, one column of details per
// point, one line per point in every distribution and timeline; nothing pools the points.

import type { LoadPointMetrics, Timeline } from './metrics.ts';
import type { Results } from './results.ts';
import type { Summary } from './stats.ts';
import { type Series, escapeXml, renderLineChart } from './svg-chart.ts';

const COLORS = ['#1f6fb4', '#e07b1a', '#2a9d4b', '#b03a8c', '#c0392b', '#6c5ce7', '#8c6d1f', '#17a2b8'];

const STYLE = `
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1b1f24; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: 8px 0; } th, td { padding: 3px 10px; border-bottom: 1px solid #eaeef2; text-align: right; }
th.group { text-align: center; border-bottom: 1px solid #d0d7de; }
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

/** One load point of one run: a column of the details, a row of the summary, a line of each chart. */
interface PointOfRun {
  run: Results;
  runIndex: number;
  point: LoadPointMetrics;
  pointIndex: number;
  /** The load point, prefixed with its run's label when several runs share the page. */
  name: string;
  color: string;
  dashed: boolean;
}

function pointsOf(runs: readonly Results[]): PointOfRun[] {
  const numPoints = Math.max(...runs.map((run) => run.load_points.length));
  return runs.flatMap((run, runIndex) =>
    run.load_points.map((point, pointIndex) => ({
      run,
      runIndex,
      point,
      pointIndex,
      name: runs.length === 1 ? describeOfferedLoad(point) : `${run.label} · ${describeOfferedLoad(point)}`,
      // A sweep's points take the colours; several runs of one point each take them instead,
      // and each run after the first is dashed, so run and point both read from a line.
      color: COLORS[(numPoints > 1 ? pointIndex : runIndex) % COLORS.length],
      dashed: numPoints > 1 && runIndex > 0,
    })),
  );
}

const SUMMARY_LATENCIES = [
  ['ttft_ms', 'TTFT (ms)'],
  ['itl_ms', 'ITL (ms)'],
  ['e2e_ms', 'end-to-end (ms)'],
] as const;

/** One row per load point: its throughput, latency percentiles and errors. */
function loadPointTable(points: readonly PointOfRun[], showRuns: boolean): string {
  const percentiles = ['p50', 'p90', 'p99'] as const;
  const groupHeader =
    `<tr>${showRuns ? '<th></th>' : ''}<th></th><th colspan="4" class="group">requests</th>` +
    SUMMARY_LATENCIES.map(([, name]) => `<th colspan="3" class="group">${name}</th>`).join('') +
    '</tr>';
  const header =
    `<tr>${showRuns ? '<th>run</th>' : ''}<th>load</th><th>sent</th><th>failed</th><th>req/s</th><th>output tok/s</th>` +
    SUMMARY_LATENCIES.map(() => percentiles.map((p) => `<th>${p}</th>`).join('')).join('') +
    '</tr>';
  const rows = points.map(({ run, point, color }) => {
    const cells = [
      `<td>${point.num_requests}</td>`,
      `<td>${point.errors.total}</td>`,
      `<td>${format(point.request_throughput, 2)}</td>`,
      `<td>${format(point.output_token_throughput)}</td>`,
      ...SUMMARY_LATENCIES.flatMap(([key]) => percentiles.map((p) => `<td>${format(point[key][p], 1)}</td>`)),
    ];
    const runCell = showRuns ? `<td>${escapeXml(run.label)}</td>` : '';
    return `<tr>${runCell}<td style="color:${color}">${escapeXml(describeOfferedLoad(point))}</td>${cells.join('')}</tr>`;
  });
  return `<table class="load-points">${groupHeader}${header}${rows.join('')}</table>`;
}

/** Every metric, one column per load point (with a B-vs-A column when exactly two are compared). */
function detailsTable(points: readonly PointOfRun[]): string {
  const hasDelta = points.length === 2 && points[0].runIndex !== points[1].runIndex;
  const header = `<tr><th>metric</th>${points.map(({ name, color }) => `<th style="color:${color}">${escapeXml(name)}</th>`).join('')}${hasDelta ? '<th>B vs A</th>' : ''}</tr>`;
  const rows: string[] = [];
  const row = (name: string, pick: (point: LoadPointMetrics) => number, digits = 1) => {
    const values = points.map(({ point }) => pick(point));
    const cells = values.map((value) => `<td>${format(value, digits)}</td>`).join('');
    rows.push(`<tr><td>${escapeXml(name)}</td>${cells}${hasDelta ? deltaCell(values[0], values[1]) : ''}</tr>`);
  };
  for (const [key, name] of LATENCIES) {
    for (const stat of STATS) row(`${name} ${stat} (ms)`, (point) => (point[key] as Summary)[stat], 2);
  }
  row('request throughput (req/s)', (point) => point.request_throughput, 2);
  row('output token throughput (tok/s)', (point) => point.output_token_throughput);
  row('input token throughput (tok/s)', (point) => point.input_token_throughput);
  if (points.some(({ point }) => point.goodput)) {
    row('goodput (req/s within targets)', (point) => point.goodput?.request_throughput ?? NaN, 2);
    row('share of requests within targets (%)', (point) => (point.goodput?.fraction ?? NaN) * 100);
  }
  row('prefix cache hit rate (%)', (point) => (point.prefix_cache_hit_rate ?? NaN) * 100);
  row('input tokens mean', (point) => point.input_tokens.mean);
  row('output tokens mean', (point) => point.output_tokens.mean);
  row('requests', (point) => point.num_requests, 0);
  row('failed requests', (point) => point.errors.total, 0);
  row('duration (s)', (point) => point.duration_s, 2);
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
      return `${offered.clients} client${offered.clients === 1 ? '' : 's'}`;
    case 'trace':
      return 'trace replay';
    case 'sweep':
      return `sweep of ${offered.num_points}`;
  }
}

function latencyCharts(points: readonly PointOfRun[]): string {
  return LATENCIES.map(([key, name]) =>
    renderLineChart({
      title: `${name}: cumulative distribution`,
      xLabel: `${name} (ms)`,
      yLabel: 'percentile',
      series: points.map(({ point, name: seriesName, color, dashed }) => ({
        name: seriesName,
        color,
        dashed,
        points: point.curves[key].map((value, q) => [value, q] as const),
      })),
    }),
  ).join('');
}

/**
 * Each load point over its own stretch of the run's clock, so a sweep reads as steps: one flat
 * segment per bucket at its rate, the last cut at the point's end (a point shorter than a
 * bucket is one segment at its true rate, not a dot).
 */
function timelineCharts(points: readonly PointOfRun[]): string {
  const timelineSeries = (pick: (timeline: Timeline) => number[]) =>
    points.map(({ point, name, color, dashed }): Series => {
      const { timeline } = point;
      // Results written before start_s existed drew every point from 0.
      const startS = timeline.start_s ?? 0;
      const endS = startS + point.duration_s;
      return {
        name,
        color,
        dashed,
        points: pick(timeline).flatMap((count, bucket) => {
          const fromS = startS + bucket * timeline.bucket_s;
          const toS = Math.min(fromS + timeline.bucket_s, endS);
          const rate = toS > fromS ? count / (toS - fromS) : 0;
          return [[fromS, rate], [toS, rate]] as const;
        }),
      };
    });
  return (
    renderLineChart({
      title: 'Output token throughput over time',
      xLabel: 'time since the run started (s)',
      yLabel: 'output tokens/s',
      series: timelineSeries((timeline) => timeline.output_tokens),
    }) +
    renderLineChart({
      title: 'Completed requests over time',
      xLabel: 'time since the run started (s)',
      yLabel: 'requests/s',
      series: timelineSeries((timeline) => timeline.requests_completed),
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
  const points = pointsOf(runs);
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeXml(title)}</title><style>${STYLE}</style></head>
<body>
<h1>${escapeXml(title)}</h1>
${runDetails(runs)}
<h2>Summary by load point</h2>
<p class="muted">Latencies over successful requests; percentiles by linear interpolation (numpy's default, as genai-perf). ITL = (e2e − TTFT) / (output tokens − 1); TPOT = e2e / output tokens.</p>
${loadPointTable(points, runs.length > 1)}
<h2>Details</h2>
${detailsTable(points)}
<h2>Latency distributions</h2>
<div class="charts">${latencyCharts(points)}</div>
<h2>Throughput over time</h2>
<div class="charts">${timelineCharts(points)}</div>
<h2>Against offered load</h2>
<div class="charts">${offeredLoadCharts(runs)}</div>
<h2>Errors</h2>
${errorTable(runs)}
</body></html>
`;
}
